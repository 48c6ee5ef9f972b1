// Compile-check stub: the hipBLAS names ggml-cuda uses (declarations only, nothing links against it).
#pragma once
#include <hip/hip_runtime.h>
typedef void * hipblasHandle_t;
typedef int hipblasStatus_t;
typedef int hipblasOperation_t;
typedef int hipblasDatatype_t;
typedef int hipblasComputeType_t;
typedef int hipblasGemmAlgo_t;
typedef int hipblasSideMode_t;
typedef int hipblasFillMode_t;
typedef int hipblasDiagType_t;
typedef int hipblasMath_t;
enum { HIPBLAS_GEMM_DEFAULT = 0, HIPBLAS_OP_N = 0, HIPBLAS_OP_T = 1, HIPBLAS_R_16F = 2, HIPBLAS_R_16B = 14, HIPBLAS_R_32F = 0,
       HIPBLAS_SIDE_RIGHT = 1, HIPBLAS_FILL_MODE_UPPER = 0, HIPBLAS_DIAG_NON_UNIT = 0, HIPBLAS_COMPUTE_16F = 0,
       HIPBLAS_COMPUTE_32F = 2, HIPBLAS_COMPUTE_32F_FAST_16F = 3, HIPBLAS_COMPUTE_32F_FAST_TF32 = 4,
       HIPBLAS_POINTER_MODE_HOST = 0, HIPBLAS_ATOMICS_ALLOWED = 1 };
enum { HIPBLAS_STATUS_SUCCESS = 0, HIPBLAS_STATUS_NOT_INITIALIZED, HIPBLAS_STATUS_ALLOC_FAILED, HIPBLAS_STATUS_INVALID_VALUE,
       HIPBLAS_STATUS_MAPPING_ERROR, HIPBLAS_STATUS_EXECUTION_FAILED, HIPBLAS_STATUS_INTERNAL_ERROR,
       HIPBLAS_STATUS_NOT_SUPPORTED, HIPBLAS_STATUS_ARCH_MISMATCH, HIPBLAS_STATUS_HANDLE_IS_NULLPTR,
       HIPBLAS_STATUS_INVALID_ENUM, HIPBLAS_STATUS_UNKNOWN };
hipblasStatus_t hipblasCreate(hipblasHandle_t *);
hipblasStatus_t hipblasDestroy(hipblasHandle_t);
hipblasStatus_t hipblasSetStream(hipblasHandle_t, hipStream_t);
hipblasStatus_t hipblasSetMathMode(hipblasHandle_t, int);
hipblasStatus_t hipblasSetAtomicsMode(hipblasHandle_t, int);
hipblasStatus_t hipblasSetPointerMode(hipblasHandle_t, int);
// the GEMM entry points ggml-cuda.cu calls, taking any arguments (defined, as nothing links them)
template <typename... A> inline hipblasStatus_t hipblasSgemm(A...) { return 0; }
template <typename... A> inline hipblasStatus_t hipblasSgemmBatched(A...) { return 0; }
template <typename... A> inline hipblasStatus_t hipblasSgemmStridedBatched(A...) { return 0; }
template <typename... A> inline hipblasStatus_t hipblasGemmEx(A...) { return 0; }
template <typename... A> inline hipblasStatus_t hipblasGemmBatchedEx(A...) { return 0; }
template <typename... A> inline hipblasStatus_t hipblasGemmStridedBatchedEx(A...) { return 0; }
template <typename... A> inline hipblasStatus_t hipblasStrsmBatched(A...) { return 0; }
