// The per-instruction-set bodies of sdpa_decode() (internal to csrc/kernels).
#pragma once

#include <cstdint>

#include "sdpa_decode.h"

namespace neuron::kernels::detail {

// Rows [row_begin, row_end) of one (batch, kv head) group, rows ordered (query head in the
// group, query row). `scratch` holds sdpa_decode_scratch_floats() floats.
using SdpaDecodeRows = void (*)(const SdpaDecodeProblem& problem, int64_t group, int64_t row_begin,
                                int64_t row_end, float* scratch);

int64_t sdpa_decode_scratch_floats(const SdpaDecodeProblem& problem, int64_t rows);

void sdpa_decode_rows_baseline(const SdpaDecodeProblem&, int64_t, int64_t, int64_t, float*);
void sdpa_decode_rows_avx2(const SdpaDecodeProblem&, int64_t, int64_t, int64_t, float*);
void sdpa_decode_rows_avx512(const SdpaDecodeProblem&, int64_t, int64_t, int64_t, float*);
void sdpa_decode_rows_avx512_bf16(const SdpaDecodeProblem&, int64_t, int64_t, int64_t, float*);

}  // namespace neuron::kernels::detail
