/*===- KilnBackend.h - The C ABI between the runtime and backend plugins ----===
 *
 * A backend plugin is a shared library named libkiln-backend-<name>.so that
 * exports one symbol, kiln_backend_entry. The runtime opens it with dlopen,
 * asks for the ABI version it speaks, and drives one "rank" (one device's
 * share of the model) through the function table. Plain C so plugins and the
 * runtime may come from different compilers; no C++ type crosses it.
 *
 * Ownership: the runtime owns the artifact bytes and the weights' bytes
 * (memory-mapped GGUF files) for the lifetime of a rank; the plugin owns
 * everything it allocates (arena, caches, slots, device copies of weights).
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
#define KILN_BACKEND_ABI_VERSION 1u

/** The symbol every plugin exports. */
#define KILN_BACKEND_ENTRY_SYMBOL "kiln_backend_entry"

typedef struct kiln_rank kiln_rank; /**< opaque, owned by the plugin */

/** One weight binding's bytes: the whole GGUF tensor as the file stores it.
 *  Index i is the artifact's weight binding i. */
typedef struct kiln_weight_bytes {
  const void *data;
  uint64_t bytes;
} kiln_weight_bytes;

typedef struct kiln_rank_options {
  uint32_t struct_bytes; /**< sizeof(kiln_rank_options) */
  uint32_t threads;      /**< CPU threads; 0 = the plugin's choice */
  uint32_t device;       /**< device ordinal (GPU backends) */
  uint32_t reserved;
} kiln_rank_options;

typedef struct kiln_backend_v1 {
  uint32_t abi_version;  /**< KILN_BACKEND_ABI_VERSION */
  uint32_t struct_bytes; /**< sizeof(kiln_backend_v1) */
  const char *name;      /**< "cpu", "cuda" */
  const char *description;

  /** Prepares rank `rank` of the artifact (its bytes were verified by the
   *  runtime): allocates the arena, the caches (zeroed) and the slots, and
   *  places the weights. */
  int (*open_rank)(const uint8_t *artifact, uint64_t artifact_bytes,
                   uint32_t rank, const kiln_weight_bytes *weights,
                   uint32_t weight_count, const kiln_rank_options *options,
                   kiln_rank **out, char *error, uint64_t error_bytes);

  /** Copies `bytes` bytes into input slot `slot` of step `step`. The size
   *  must equal the slot's. */
  int (*write_slot)(kiln_rank *rank, const char *step, const char *slot,
                    const void *data, uint64_t bytes, char *error,
                    uint64_t error_bytes);

  /** Runs step `step` once, to completion. */
  int (*run_step)(kiln_rank *rank, const char *step, char *error,
                  uint64_t error_bytes);

  /** Copies output slot `slot` of step `step` out; sizes must match. */
  int (*read_slot)(kiln_rank *rank, const char *step, const char *slot,
                   void *data, uint64_t bytes, char *error,
                   uint64_t error_bytes);

  /** Zeroes the caches: a new sequence starts at position 0. */
  int (*reset)(kiln_rank *rank, char *error, uint64_t error_bytes);

  void (*close_rank)(kiln_rank *rank);
} kiln_backend_v1;

/** Returns the plugin's function table for `abi_version`, or NULL when it
 *  does not speak that version. */
typedef const kiln_backend_v1 *(*kiln_backend_entry_fn)(uint32_t abi_version);

#ifdef __cplusplus
}
#endif

#endif /* KILN_RUNTIME_BACKEND_KILNBACKEND_H */
