"""One torchrun rank of the Diffusers tensor-parallel test (tests/test_diffusers_parallel.py).

For each named case: the pipeline's output on one neuron device (no parallelism), then the
same pipeline with its transformer sharded by ``enable_parallelism(config=
TensorParallelConfig(tp_degree=WORLD_SIZE))``; prints one line per case with the largest
difference, which the test checks against its tolerance.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from diffusers import TensorParallelConfig

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
import support.diffusers_fixtures as fixtures  # noqa: E402


def main(names: list[str]) -> None:
    rank = int(os.environ["RANK"])
    torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("neuron")
    for name in names:
        case = fixtures.CASES[name]
        one_device = fixtures.run(case.build().to("neuron"), case.inputs(), "neuron")

        pipe = case.build()  # sharding starts from CPU weights (diffusers' neuron TP backend)
        denoiser = getattr(pipe, case.denoiser)
        denoiser.enable_parallelism(config=TensorParallelConfig(tp_degree=dist.get_world_size()))
        sharded = sum(type(p).__name__ == "DTensor" for p in denoiser.parameters())
        pipe.to("neuron")
        parallel = fixtures.run(pipe, case.inputs(), "neuron")
        diff = (parallel - one_device).abs().max().item()
        print(f"rank {rank} {name} sharded={sharded} max_diff={diff:.3e}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
