// The built-in chip profiles (trn1, trn2, trn3) from AWS's published figures, and the
// nrt_chip_profile_* calls that list and find them.
#include "chip_profile.h"

#include <cctype>
#include <string>

namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kMiB = uint64_t{1} << 20;

struct ProfileEntry {
  nrt_chip_profile profile;
  const char* core_generation;
};

// Figures per chip from AWS's published specifications (see docs for sources).
const ProfileEntry kProfiles[] = {
    {{"trn1", 2, 1, 1, 32 * kGiB, 820e9, 190e12, 47.5e12, 24 * kMiB}, "NeuronCore-v2"},
    {{"trn2", 8, 2, 2, 96 * kGiB, 2.9e12, 667e12, 181e12, 28 * kMiB}, "NeuronCore-v3"},
    {{"trn3", 8, 2, 2, 144 * kGiB, 4.9e12, 671e12, 0.0, 32 * kMiB}, "NeuronCore-v4"},
};

constexpr int kProfileCount = static_cast<int>(sizeof(kProfiles) / sizeof(kProfiles[0]));

bool equals_ignoring_case(const char* a, const char* b) {
  for (; *a != '\0' && *b != '\0'; ++a, ++b) {
    if (std::tolower(static_cast<unsigned char>(*a)) !=
        std::tolower(static_cast<unsigned char>(*b))) {
      return false;
    }
  }
  return *a == '\0' && *b == '\0';
}

}  // namespace

namespace nrt {

const char* core_generation(const nrt_chip_profile* profile) {
  for (const ProfileEntry& entry : kProfiles) {
    if (&entry.profile == profile) return entry.core_generation;
  }
  return "NeuronCore";
}

std::string known_profile_names() {
  std::string names;
  for (const ProfileEntry& entry : kProfiles) {
    if (!names.empty()) names += ", ";
    names += entry.profile.name;
  }
  return names;
}

}  // namespace nrt

extern "C" const nrt_chip_profile* nrt_chip_profile_find(const char* name) {
  if (name == nullptr) return nullptr;
  for (const ProfileEntry& entry : kProfiles) {
    if (equals_ignoring_case(entry.profile.name, name)) return &entry.profile;
  }
  return nullptr;
}

extern "C" int nrt_chip_profile_count(void) { return kProfileCount; }

extern "C" const nrt_chip_profile* nrt_chip_profile_at(int index) {
  if (index < 0 || index >= kProfileCount) return nullptr;
  return &kProfiles[index].profile;
}
