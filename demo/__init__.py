"""The main job (``python -m demo``, ``scripts/demo.sh``): fine-tune a small causal LM on neuron.

It lives beside the installable package, not in it: a demonstration, run from a checkout.

- ``finetune``: the single-process run (and the launch of the torchrun recipe);
- ``arguments``: the command line both runs share;
- ``task``: the addition problems (data, prompts, answers, accuracy);
- ``tokenizer``: a character-level tokenizer made locally;
- ``model``: the model sizes, built from a ``LlamaConfig``;
- ``training``: TRL ``SFTTrainer`` with a progress bar and the loss;
- ``evaluation``: greedy answers on the device and their accuracy;
- ``cpu_reload``: a script run in a plain CPU process (no device) on the saved checkpoint;
- ``distributed``: the TP x FSDP recipe under torchrun.
"""
