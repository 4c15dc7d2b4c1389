// FULCRUM_VECTOR_CLONES: a function compiled twice, for AVX2 and the
// baseline, the dynamic loader picking the one the CPU runs (the update
// loops of the dense optimizers and the sparse tables). ThreadSanitizer's
// runtime is not up yet when the loader runs the clones' resolver: its
// builds get the default clone only.
#ifndef FULCRUM_COMMON_VECTOR_CLONES_H_
#define FULCRUM_COMMON_VECTOR_CLONES_H_

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FULCRUM_NO_CLONES
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define FULCRUM_NO_CLONES
#endif
#ifdef FULCRUM_NO_CLONES
#define FULCRUM_VECTOR_CLONES
#else
#define FULCRUM_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#endif

#endif  // FULCRUM_COMMON_VECTOR_CLONES_H_
