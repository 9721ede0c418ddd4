// GCC 12's AVX-512 headers build "undefined" vectors as `__Y = __Y` (GCC bug 105593), which
// raises spurious (maybe-)uninitialized warnings wherever those intrinsics are inlined. A file
// that inlines them includes this first; the warnings stay off to the end of that file.
#ifndef FUCINA_KERNELS_CPU_AVX512_UNDEFINED_VECTORS_H_
#define FUCINA_KERNELS_CPU_AVX512_UNDEFINED_VECTORS_H_

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#endif  // FUCINA_KERNELS_CPU_AVX512_UNDEFINED_VECTORS_H_
