/* The CPU features this build was compiled for, named as Linux's /proc/cpuinfo names them
 * ("flags" on x86, "Features" on aarch64), from the compiler's own feature macros.
 *
 * A prebuilt library (the paged-llm-kernels wheel: one build per instruction-set level, see
 * kernels/cpu/compiler.py) must only be loaded on a CPU that has every one of them, or its
 * first vector instruction kills the process. The wheel's build records this string by
 * preprocessing this header with the build's flags; at load, paged_llm_cpu_needs() is asked
 * of the library itself and must give the same string (a self-check that the file is the
 * build its manifest says it is).
 */
#ifndef PAGED_LLM_CPU_NEEDS_H
#define PAGED_LLM_CPU_NEEDS_H

#if defined(__x86_64__)
#define PL_NEED_SSE2 "sse2"
#else
#define PL_NEED_SSE2 ""
#endif
#ifdef __SSSE3__
#define PL_NEED_SSSE3 " ssse3"
#else
#define PL_NEED_SSSE3 ""
#endif
#ifdef __SSE4_1__
#define PL_NEED_SSE4_1 " sse4_1"
#else
#define PL_NEED_SSE4_1 ""
#endif
#ifdef __SSE4_2__
#define PL_NEED_SSE4_2 " sse4_2"
#else
#define PL_NEED_SSE4_2 ""
#endif
#ifdef __POPCNT__
#define PL_NEED_POPCNT " popcnt"
#else
#define PL_NEED_POPCNT ""
#endif
#ifdef __AVX__
#define PL_NEED_AVX " avx"
#else
#define PL_NEED_AVX ""
#endif
#ifdef __AVX2__
#define PL_NEED_AVX2 " avx2"
#else
#define PL_NEED_AVX2 ""
#endif
#ifdef __FMA__
#define PL_NEED_FMA " fma"
#else
#define PL_NEED_FMA ""
#endif
#ifdef __F16C__
#define PL_NEED_F16C " f16c"
#else
#define PL_NEED_F16C ""
#endif
#ifdef __BMI__
#define PL_NEED_BMI " bmi1"
#else
#define PL_NEED_BMI ""
#endif
#ifdef __BMI2__
#define PL_NEED_BMI2 " bmi2"
#else
#define PL_NEED_BMI2 ""
#endif
#ifdef __LZCNT__
#define PL_NEED_LZCNT " abm"
#else
#define PL_NEED_LZCNT ""
#endif
#ifdef __MOVBE__
#define PL_NEED_MOVBE " movbe"
#else
#define PL_NEED_MOVBE ""
#endif
#ifdef __AVX512F__
#define PL_NEED_AVX512F " avx512f"
#else
#define PL_NEED_AVX512F ""
#endif
#ifdef __AVX512BW__
#define PL_NEED_AVX512BW " avx512bw"
#else
#define PL_NEED_AVX512BW ""
#endif
#ifdef __AVX512CD__
#define PL_NEED_AVX512CD " avx512cd"
#else
#define PL_NEED_AVX512CD ""
#endif
#ifdef __AVX512DQ__
#define PL_NEED_AVX512DQ " avx512dq"
#else
#define PL_NEED_AVX512DQ ""
#endif
#ifdef __AVX512VL__
#define PL_NEED_AVX512VL " avx512vl"
#else
#define PL_NEED_AVX512VL ""
#endif
#ifdef __AVX512VNNI__
#define PL_NEED_AVX512VNNI " avx512_vnni"
#else
#define PL_NEED_AVX512VNNI ""
#endif
#ifdef __AVXVNNI__
#define PL_NEED_AVXVNNI " avx_vnni"
#else
#define PL_NEED_AVXVNNI ""
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#define PL_NEED_NEON "asimd"
#else
#define PL_NEED_NEON ""
#endif
#ifdef __ARM_FEATURE_ATOMICS
#define PL_NEED_ATOMICS " atomics"
#else
#define PL_NEED_ATOMICS ""
#endif
#ifdef __ARM_FEATURE_QRDMX
#define PL_NEED_RDM " asimdrdm"
#else
#define PL_NEED_RDM ""
#endif
#ifdef __ARM_FEATURE_DOTPROD
#define PL_NEED_DOTPROD " asimddp"
#else
#define PL_NEED_DOTPROD ""
#endif
#ifdef __ARM_FEATURE_FP16_VECTOR_ARITHMETIC
#define PL_NEED_FP16 " asimdhp"
#else
#define PL_NEED_FP16 ""
#endif

/* One string literal; kernels/cpu/compiler.py reads it from the preprocessor's output. */
#define PAGED_LLM_CPU_NEEDS                                                                  \
    PL_NEED_SSE2 PL_NEED_SSSE3 PL_NEED_SSE4_1 PL_NEED_SSE4_2 PL_NEED_POPCNT PL_NEED_AVX     \
        PL_NEED_AVX2 PL_NEED_FMA PL_NEED_F16C PL_NEED_BMI PL_NEED_BMI2 PL_NEED_LZCNT         \
            PL_NEED_MOVBE PL_NEED_AVX512F PL_NEED_AVX512BW PL_NEED_AVX512CD                  \
                PL_NEED_AVX512DQ PL_NEED_AVX512VL PL_NEED_AVX512VNNI PL_NEED_AVXVNNI         \
                    PL_NEED_NEON PL_NEED_ATOMICS PL_NEED_RDM PL_NEED_DOTPROD PL_NEED_FP16

/* The CPU features this library needs, space-separated (exported for the loader's check). */
const char *paged_llm_cpu_needs(void) { return PAGED_LLM_CPU_NEEDS; }

#endif
