// Small helpers for reading the environment and the text found there.
#pragma once

#include <optional>
#include <string>

namespace nrt {

// The value of an environment variable, or nullopt when it is unset.
std::optional<std::string> get_env(const char* name);

// `text` without leading and trailing whitespace.
std::string trim(const std::string& text);

// Parses a non-negative decimal integer made of digits only (no sign, no spaces), at most
// `max_value`. Returns false for anything else.
bool parse_uint(const std::string& text, unsigned long long max_value, unsigned long long* out);

}  // namespace nrt
