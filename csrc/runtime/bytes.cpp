// Byte counts printed ("2.00 GiB") and parsed ("1.5GiB") for the runtime's messages and
// environment variables (bytes.h).
#include "bytes.h"

#include <cctype>
#include <cmath>
#include <cstdio>

#include "env.h"

namespace nrt {

std::string format_bytes(uint64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.2f %s", value, kUnits[unit]);
  return buffer;
}

namespace {

// Multiplier for a lower-cased suffix, or 0 if the suffix is not one we accept.
uint64_t suffix_multiplier(const std::string& suffix) {
  if (suffix.empty() || suffix == "b") return 1;
  const std::string letters = "kmgt";
  for (size_t i = 0; i < letters.size(); ++i) {
    std::string one(1, letters[i]);
    if (suffix == one || suffix == one + "ib") return uint64_t{1} << (10 * (i + 1));
  }
  return 0;
}

}  // namespace

bool parse_byte_size(const std::string& raw, uint64_t* out, std::string* why) {
  const std::string text = trim(raw);
  size_t pos = 0;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) ++pos;
  const std::string whole = text.substr(0, pos);
  std::string fraction;
  if (pos < text.size() && text[pos] == '.') {
    size_t start = ++pos;
    while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) ++pos;
    fraction = text.substr(start, pos - start);
  }
  if (whole.empty() && fraction.empty()) {
    *why = "expected a number of bytes, optionally with a unit (e.g. 64GiB, 1.5GiB, 1048576)";
    return false;
  }
  std::string suffix;
  for (char c : trim(text.substr(pos))) {
    suffix += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  const uint64_t multiplier = suffix_multiplier(suffix);
  if (multiplier == 0) {
    *why = "unknown unit '" + trim(text.substr(pos)) +
           "'; use B, KiB, MiB, GiB or TiB (K, M, G, T also mean binary units)";
    return false;
  }
  const unsigned long long limit = (1ULL << 62) / multiplier;
  unsigned long long whole_value = 0;
  if (!whole.empty() && !parse_uint(whole, limit, &whole_value)) {
    *why = "the size is too large";
    return false;
  }
  long double frac_value = 0;
  if (!fraction.empty()) frac_value = std::stold("0." + fraction);
  *out = whole_value * multiplier +
         static_cast<uint64_t>(std::floor(frac_value * static_cast<long double>(multiplier)));
  return true;
}

}  // namespace nrt
