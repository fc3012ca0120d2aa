// The software NeuronCore runtime: a small C API shaped like a hardware runtime's, so that a
// hardware runtime can replace it behind the same seam. No torch types here or below.
//
// Every call returns an nrt_status; on failure, nrt_last_error() gives a human-readable
// message for the calling thread. Initialisation is lazy: the first call that needs the
// topology reads the environment (see docs/architecture.md for the variables).
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nrt_status {
  NRT_SUCCESS = 0,
  NRT_INVALID_ARGUMENT = 1,  // a null pointer, a negative size, an unknown flag
  NRT_INVALID_DEVICE = 2,    // a logical-core index outside [0, device_count)
  NRT_INVALID_CONFIG = 3,    // a malformed or inconsistent environment variable
  NRT_OUT_OF_MEMORY = 4,     // the core's HBM capacity or the host budget is exhausted
  NRT_NOT_READY = 5,         // a query on work that has not completed yet
  NRT_INVALID_HANDLE = 6,    // an unknown stream, event or pointer
  NRT_FORKED_CHILD = 7,      // the runtime was initialised in the parent before fork()
} nrt_status;

// Figures of one chip generation, from AWS's published specifications.
typedef struct nrt_chip_profile {
  const char* name;                  // "trn1", "trn2", "trn3"
  int physical_cores_per_chip;       // NeuronCores per chip
  int default_logical_nc_config;     // physical cores grouped into one logical core by default
  int max_logical_nc_config;         // largest allowed grouping (1 or 2)
  uint64_t hbm_bytes_per_chip;       // HBM capacity per chip
  double hbm_bandwidth_bytes_per_s;  // HBM bandwidth per chip
  double peak_bf16_flops_per_chip;   // dense BF16
  double peak_fp32_flops_per_chip;   // dense FP32 (0 where AWS publishes none)
  uint64_t sbuf_bytes_per_core;      // on-chip SBUF per physical core
} nrt_chip_profile;

// What one logical core (one torch device) looks like.
typedef struct nrt_device_properties {
  char name[64];  // e.g. "NeuronCore-v3 (trn2, LNC=2)"
  const nrt_chip_profile* chip;
  int logical_nc_config;    // physical cores per logical core
  int physical_core_first;  // first physical core index of this logical core
  int chip_index;           // which chip of the (software) instance
  uint64_t hbm_bytes;       // profile HBM per logical core
  uint64_t capacity_bytes;  // allocatable: hbm_bytes capped by the host budget
  double hbm_bandwidth_bytes_per_s;
  double peak_bf16_flops;
  double peak_fp32_flops;
} nrt_device_properties;

// ---- errors and lifetime -------------------------------------------------------------
const char* nrt_status_name(nrt_status status);
// The message of the last failing call on this thread ("" if none).
const char* nrt_last_error(void);
// Reads the environment and builds the topology once; later calls are no-ops.
nrt_status nrt_init(void);
int nrt_is_initialized(void);
// Testing hook: forget the topology and all device state so the environment is read again.
// Fails with NRT_INVALID_ARGUMENT while memory is still allocated.
nrt_status nrt_reset_for_testing(void);

// ---- chip profiles and topology ------------------------------------------------------
// Looks up a profile by name; returns NULL for an unknown name.
const nrt_chip_profile* nrt_chip_profile_find(const char* name);
// Number of built-in profiles and the i-th one (for listings).
int nrt_chip_profile_count(void);
const nrt_chip_profile* nrt_chip_profile_at(int index);
nrt_status nrt_device_count(int* count);
nrt_status nrt_device_get_properties(int device, nrt_device_properties* properties);

// ---- memory --------------------------------------------------------------------------
// Device memory is host-addressable in the software runtime; alignment is 64 bytes at least.
nrt_status nrt_mem_alloc(int device, size_t nbytes, void** out_ptr);
nrt_status nrt_mem_free(int device, void* ptr);
// Device memory other processes can map (the software runtime's IPC): a size-sealed memory
// file mapped shared. *out_fd belongs to the runtime until nrt_mem_free(ptr); pass a
// duplicate of it to another process (SCM_RIGHTS, spawn), which maps it with
// nrt_mem_import_shared. The pages live until no process holds a descriptor or mapping.
// Both calls charge the device and host budget of the calling process.
nrt_status nrt_mem_alloc_shared(int device, size_t nbytes, void** out_ptr, int* out_fd);
// Maps shared memory of exactly nbytes from fd (duplicated, not taken; *out_fd is the
// runtime's own descriptor, valid until nrt_mem_free). NRT_INVALID_HANDLE if fd is not
// neuron shared memory of that size.
nrt_status nrt_mem_import_shared(int device, int fd, size_t nbytes, void** out_ptr, int* out_fd);
// The descriptor of a shared allocation (owned by the runtime); NRT_INVALID_HANDLE otherwise.
nrt_status nrt_mem_shared_fd(int device, const void* ptr, int* out_fd);
// Bytes currently held from the device's arena and the device's capacity.
nrt_status nrt_mem_get_info(int device, uint64_t* used_bytes, uint64_t* capacity_bytes);
// Process-wide host budget shared by all devices, and what is used of it.
void nrt_host_budget(uint64_t* used_bytes, uint64_t* budget_bytes);

// ---- streams -------------------------------------------------------------------------
// Streams are in-order queues identified by a small index per device; index 0 is the
// default stream, which always exists. In blocking mode (the current one) work runs on
// the caller's thread when it is launched; callers must not rely on that.
typedef void (*nrt_task_fn)(void* arg);
nrt_status nrt_stream_create(int device, int priority, int* out_stream);
nrt_status nrt_stream_launch(int device, int stream, nrt_task_fn fn, void* arg);
nrt_status nrt_stream_synchronize(int device, int stream);
// NRT_SUCCESS when all launched work has completed, NRT_NOT_READY otherwise.
nrt_status nrt_stream_query(int device, int stream);
int nrt_launch_blocking(void);  // NEURON_LAUNCH_BLOCKING=1
nrt_status nrt_device_synchronize(int device);

// ---- events --------------------------------------------------------------------------
typedef struct nrt_event* nrt_event_t;
enum { NRT_EVENT_DEFAULT = 0, NRT_EVENT_TIMING = 1 };
nrt_status nrt_event_create(unsigned flags, nrt_event_t* out_event);
nrt_status nrt_event_destroy(nrt_event_t event);
nrt_status nrt_event_record(nrt_event_t event, int device, int stream);
// NRT_SUCCESS if the recorded work has completed (or nothing was recorded), else NOT_READY.
nrt_status nrt_event_query(nrt_event_t event);
nrt_status nrt_event_synchronize(nrt_event_t event);
// Makes later work on (device, stream) wait for the event.
nrt_status nrt_stream_wait_event(int device, int stream, nrt_event_t event);
// Milliseconds between two recorded, completed timing events.
nrt_status nrt_event_elapsed_ms(nrt_event_t start, nrt_event_t end, double* out_ms);

// ---- copies --------------------------------------------------------------------------
// Copies nbytes between any two host-addressable regions (host or device), in stream order.
nrt_status nrt_memcpy(int device, int stream, void* dst, const void* src, size_t nbytes);
nrt_status nrt_memset(int device, int stream, void* dst, int value, size_t nbytes);

// ---- fork safety ---------------------------------------------------------------------
// True in a child forked after the parent initialised the runtime; the runtime refuses work
// there (NRT_FORKED_CHILD) because its state belongs to the parent.
int nrt_in_bad_fork(void);

#ifdef __cplusplus
}  // extern "C"
#endif
