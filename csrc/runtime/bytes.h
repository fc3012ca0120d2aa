// Byte quantities as people write and read them ("1.5GiB", "2.00 GiB").
#pragma once

#include <cstdint>
#include <string>

namespace nrt {

// Human-readable size with binary units: "512 B", "1.50 KiB", "2.00 GiB".
std::string format_bytes(uint64_t bytes);

// Parses a byte count with an optional binary suffix: B, K/KiB, M/MiB, G/GiB, T/TiB
// (case-insensitive, optional space before the suffix); decimals such as "1.5GiB" are
// allowed and rounded down to whole bytes. On failure returns false and says why.
bool parse_byte_size(const std::string& text, uint64_t* out, std::string* why);

}  // namespace nrt
