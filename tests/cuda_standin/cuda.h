// The CUDA driver API's few names the GPU delivery's sources use, for the stand-in runtime
// (standin.cpp): the host side of gpu/ built and tested where no CUDA toolkit is.
#pragma once

typedef int CUresult;
#define CUDA_SUCCESS 0
typedef int CUdevice_attribute;
#define CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 124

CUresult cuGetErrorName(CUresult error, const char** name);
CUresult cuGetErrorString(CUresult error, const char** text);
