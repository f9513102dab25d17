/*===- KilnBackend.h - The C ABI between the runtime and backend plugins ----===
 *
 * A backend plugin is a shared library named libkiln-backend-<name>.so that
 * exports one symbol, kiln_backend_entry. The runtime opens it with dlopen,
 * asks for the ABI version it speaks, and drives one "group": every
 * tensor-parallel rank of the artifact (one device's share of the model
 * each), run together, collectives between them inside the plugin. Plain C
 * so plugins and the runtime may come from different compilers; no C++
 * type crosses it.
 *
 * Ownership: the runtime owns the artifact bytes and the weights' bytes
 * (memory-mapped GGUF files) for the lifetime of a group; the plugin owns
 * everything it allocates (arenas, caches, slots, each rank's copy of its
 * weight slices).
 * Every call returns 0 on success, or non-zero with a NUL-terminated message
 * in `error` (at most `error_bytes` bytes including the NUL).
 *===----------------------------------------------------------------------===*/
#ifndef KILN_RUNTIME_BACKEND_KILNBACKEND_H
#define KILN_RUNTIME_BACKEND_KILNBACKEND_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** The ABI version of this header. A change to any struct or function
 *  below increments it. */
#define KILN_BACKEND_ABI_VERSION 3u

/** The symbol every plugin exports. */
#define KILN_BACKEND_ENTRY_SYMBOL "kiln_backend_entry"

typedef struct kiln_group kiln_group; /**< opaque, owned by the plugin */

/** One weight binding's bytes: the whole GGUF tensor as the file stores it
 *  (a binding with a slice names the part its rank takes). Index i is the
 *  artifact's weight binding i. */
typedef struct kiln_weight_bytes {
  const void *data;
  uint64_t bytes;
} kiln_weight_bytes;

/** kiln_rank_options.flags. A plugin refuses a flag it does not support. */
/** Run each step op by op instead of replaying its captured graph. */
#define KILN_RUN_EAGER 1u
/** No weight bytes: fill every weight with random valid blocks from
 *  `seed` on the device (benchmarks; `weights` may then be NULL). */
#define KILN_RUN_RANDOM_WEIGHTS 2u
/** Open only rank `simulate_rank` of the artifact, alone on `device`, with
 *  every collective replaced by local work of the same memory traffic: one
 *  GPU measures the per-GPU work of the whole deployment. */
#define KILN_RUN_SIMULATE_RANK 4u
/** Time every op (eager, an event pair per op) and print each step's time
 *  by op kind to stderr when the group closes. */
#define KILN_RUN_PROFILE 8u
/** Open every rank of the artifact on the one GPU `device`, each on its own
 *  stream and host thread, the collectives exchanging through that GPU's
 *  memory: a tp=N plan's results checked on a host with one GPU (not its
 *  speed: the ranks share the GPU, and no launch overlaps its predecessor,
 *  so that a rank waiting in a collective never holds the multiprocessors
 *  the others need to reach it). GPU backends only. */
#define KILN_RUN_ONE_GPU 16u

typedef struct kiln_rank_options {
  uint32_t struct_bytes;  /**< sizeof(kiln_rank_options) */
  uint32_t threads;       /**< CPU threads in all; 0 = the plugin's choice */
  uint32_t device;        /**< first device ordinal (GPU backends) */
  uint32_t flags;         /**< KILN_RUN_* */
  uint32_t simulate_rank; /**< with KILN_RUN_SIMULATE_RANK */
  uint32_t reserved;
  uint64_t seed;           /**< random weights and cache contents */
  uint64_t fill_positions; /**< caches' first positions filled with random
                                values at open and reset (benchmarks) */
} kiln_rank_options;

typedef struct kiln_backend_v1 {
  uint32_t abi_version;  /**< KILN_BACKEND_ABI_VERSION */
  uint32_t struct_bytes; /**< sizeof(kiln_backend_v1) */
  const char *name;      /**< "cpu", "cuda" */
  const char *description;

  /** Prepares every rank of the artifact (its bytes were verified by the
   *  runtime): allocates each rank's arena, caches (zeroed) and slots, and
   *  places each rank's weights (its slices of the split ones). */
  int (*open_group)(const uint8_t *artifact, uint64_t artifact_bytes,
                    const kiln_weight_bytes *weights, uint32_t weight_count,
                    const kiln_rank_options *options, kiln_group **out,
                    char *error, uint64_t error_bytes);

  /** Copies `bytes` bytes into input slot `slot` of step `step` of every
   *  rank (inputs are the same on all ranks). The size must equal the
   *  slot's. */
  int (*write_slot)(kiln_group *group, const char *step, const char *slot,
                    const void *data, uint64_t bytes, char *error,
                    uint64_t error_bytes);

  /** Runs step `step` once on every rank, to completion. */
  int (*run_step)(kiln_group *group, const char *step, char *error,
                  uint64_t error_bytes);

  /** Copies output slot `slot` of step `step` out (rank 0's; outputs are
   *  the same on all ranks); sizes must match. */
  int (*read_slot)(kiln_group *group, const char *step, const char *slot,
                   void *data, uint64_t bytes, char *error,
                   uint64_t error_bytes);

  /** Zeroes every rank's caches (or refills their first fill_positions
   *  with random values): a new sequence starts. */
  int (*reset)(kiln_group *group, char *error, uint64_t error_bytes);

  void (*close_group)(kiln_group *group);
} kiln_backend_v1;

/** Returns the plugin's function table for `abi_version`, or NULL when it
 *  does not speak that version. */
typedef const kiln_backend_v1 *(*kiln_backend_entry_fn)(uint32_t abi_version);

#ifdef __cplusplus
}
#endif

#endif /* KILN_RUNTIME_BACKEND_KILNBACKEND_H */
