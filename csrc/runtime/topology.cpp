// The visible logical cores (topology.h) from NEURON_PLATFORM_TARGET_OVERRIDE,
// NEURON_LOGICAL_NC_CONFIG, TORCHNEURON_CHIPS and NEURON_RT_VISIBLE_CORES.
#include "topology.h"

#include <cstdio>
#include <string>

#include "chip_profile.h"
#include "env.h"
#include "error.h"

namespace nrt {
namespace {

constexpr int kMaxChips = 64;

std::string quoted(const std::string& value) { return "\"" + value + "\""; }

nrt_status read_profile(const nrt_chip_profile** out) {
  const std::string value = get_env("NEURON_PLATFORM_TARGET_OVERRIDE").value_or("trn2");
  *out = nrt_chip_profile_find(trim(value).c_str());
  if (*out != nullptr) return NRT_SUCCESS;
  return fail(NRT_INVALID_CONFIG,
              "NEURON_PLATFORM_TARGET_OVERRIDE=" + quoted(value) +
                  " is not a known chip profile; known profiles: " + known_profile_names());
}

nrt_status read_lnc(const nrt_chip_profile* profile, int* out) {
  const auto value = get_env("NEURON_LOGICAL_NC_CONFIG");
  *out = profile->default_logical_nc_config;
  if (!value) return NRT_SUCCESS;
  unsigned long long lnc = 0;
  if (parse_uint(trim(*value), 1000, &lnc) && lnc >= 1 &&
      lnc <= static_cast<unsigned long long>(profile->max_logical_nc_config)) {
    *out = static_cast<int>(lnc);
    return NRT_SUCCESS;
  }
  const std::string allowed = profile->max_logical_nc_config == 1
                                  ? "the only allowed value is 1"
                                  : "allowed values are 1 and 2 (default " +
                                        std::to_string(profile->default_logical_nc_config) + ")";
  return fail(NRT_INVALID_CONFIG, "NEURON_LOGICAL_NC_CONFIG=" + quoted(*value) +
                                      " is invalid for " + profile->name + ": " + allowed);
}

nrt_status read_chips(int* out) {
  const auto value = get_env("TORCHNEURON_CHIPS");
  *out = 1;
  if (!value) return NRT_SUCCESS;
  unsigned long long chips = 0;
  if (parse_uint(trim(*value), kMaxChips, &chips) && chips >= 1) {
    *out = static_cast<int>(chips);
    return NRT_SUCCESS;
  }
  return fail(NRT_INVALID_CONFIG, "TORCHNEURON_CHIPS=" + quoted(*value) +
                                      " is invalid: expected an integer from 1 to " +
                                      std::to_string(kMaxChips));
}

// Parses one index of NEURON_RT_VISIBLE_CORES; `why` says what is wrong otherwise.
bool parse_core_index(const std::string& text, const std::string& item, long* out,
                      std::string* why) {
  unsigned long long value = 0;
  if (!text.empty() && text[0] == '-') {
    *why = "'" + item + "' is negative";
    return false;
  }
  if (!parse_uint(text, 1000000000ULL, &value)) {
    *why = "'" + item + "' is not a core index or an inclusive range like 0-3";
    return false;
  }
  *out = static_cast<long>(value);
  return true;
}

// Parses "0-1,3" into ascending, unique indices below `count`.
bool parse_core_list(const std::string& text, int count, std::vector<bool>* visible,
                     std::string* why) {
  visible->assign(static_cast<size_t>(count), false);
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item =
        trim(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (item.empty()) {
      *why = "it has an empty item (a leading, trailing or doubled comma)";
      return false;
    }
    long first = 0;
    long last = 0;
    const size_t dash = item.find('-', 1);
    if (dash == std::string::npos) {
      if (!parse_core_index(item, item, &first, why)) return false;
      last = first;
    } else {
      const std::string high = trim(item.substr(dash + 1));
      if (high.empty()) {
        *why = "range '" + item + "' has no end";
        return false;
      }
      if (!parse_core_index(trim(item.substr(0, dash)), item, &first, why) ||
          !parse_core_index(high, item, &last, why)) {
        return false;
      }
      if (first > last) {
        *why = "range '" + item + "' is reversed (write it as " + std::to_string(last) + "-" +
               std::to_string(first) + ")";
        return false;
      }
    }
    if (last >= count) {
      *why = "core " + std::to_string(first >= count ? first : count) + " does not exist";
      return false;
    }
    for (long core = first; core <= last; ++core) {
      if ((*visible)[static_cast<size_t>(core)]) {
        *why = "core " + std::to_string(core) + " is listed more than once";
        return false;
      }
      (*visible)[static_cast<size_t>(core)] = true;
    }
    if (comma == std::string::npos) return true;
    start = comma + 1;
  }
}

nrt_device_properties make_device(const Topology& topo, int logical_core) {
  const nrt_chip_profile* profile = topo.profile;
  const int lnc = topo.logical_nc_config;
  const int cores = profile->physical_cores_per_chip;
  const double share = static_cast<double>(lnc) / cores;
  nrt_device_properties props{};
  std::snprintf(props.name, sizeof(props.name), "%s (%s, LNC=%d)", core_generation(profile),
                profile->name, lnc);
  props.chip = profile;
  props.logical_nc_config = lnc;
  props.physical_core_first = logical_core * lnc;
  props.chip_index = logical_core / (cores / lnc);
  props.hbm_bytes =
      profile->hbm_bytes_per_chip * static_cast<uint64_t>(lnc) / static_cast<uint64_t>(cores);
  props.capacity_bytes = props.hbm_bytes;
  props.hbm_bandwidth_bytes_per_s = profile->hbm_bandwidth_bytes_per_s * share;
  props.peak_bf16_flops = profile->peak_bf16_flops_per_chip * share;
  props.peak_fp32_flops = profile->peak_fp32_flops_per_chip * share;
  return props;
}

}  // namespace

nrt_status read_topology(Topology* out) {
  Topology topo;
  nrt_status status = read_profile(&topo.profile);
  if (status == NRT_SUCCESS) status = read_lnc(topo.profile, &topo.logical_nc_config);
  if (status == NRT_SUCCESS) status = read_chips(&topo.chips);
  if (status != NRT_SUCCESS) return status;
  topo.logical_core_count =
      topo.chips * topo.profile->physical_cores_per_chip / topo.logical_nc_config;

  std::vector<bool> visible(static_cast<size_t>(topo.logical_core_count), true);
  const std::string cores = get_env("NEURON_RT_VISIBLE_CORES").value_or("");
  std::string why;
  if (!trim(cores).empty() && !parse_core_list(cores, topo.logical_core_count, &visible, &why)) {
    return fail(NRT_INVALID_CONFIG,
                "NEURON_RT_VISIBLE_CORES=" + quoted(cores) + " is invalid: " + why +
                    "; valid logical cores are 0-" + std::to_string(topo.logical_core_count - 1) +
                    " for " + topo.profile->name +
                    " with NEURON_LOGICAL_NC_CONFIG=" + std::to_string(topo.logical_nc_config) +
                    " and " + std::to_string(topo.chips) + (topo.chips == 1 ? " chip" : " chips"));
  }
  for (int core = 0; core < topo.logical_core_count; ++core) {
    if (visible[static_cast<size_t>(core)]) topo.devices.push_back(make_device(topo, core));
  }
  *out = std::move(topo);
  return NRT_SUCCESS;
}

}  // namespace nrt
