// A stand-in NVML for apiary's tests, built as libnvidia-ml.so.1 against
// the nvml.h that github.com/NVIDIA/go-nvml carries: a hive that finds it
// (LD_LIBRARY_PATH) reads the stand-in GPUs through its real NVML code.
// It reports the devices of $APIARY_STANDIN_GPU_DIR/devices and, as each
// device's processes, what the stand-in backend (backend.c) records there
// for every live process; free memory is the total less their sum, so a
// process that ends gives its memory back, as a driver does.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvml.h"
#include "standin.h"

static char dir[4096];
static struct standin_spec specs[STANDIN_MAX_DEVICES];
static int n_devices = -1;

// CUDA version the stand-in driver supports: $APIARY_STANDIN_CUDA
// (1000*major + 10*minor), default 12080.
static int cuda_version(void) {
	const char *v = getenv("APIARY_STANDIN_CUDA");
	return v && *v ? atoi(v) : 12080;
}

nvmlReturn_t nvmlInit_v2(void) {
	const char *d = getenv(STANDIN_DIR_ENV);
	if (!d || !*d) return NVML_ERROR_DRIVER_NOT_LOADED;
	snprintf(dir, sizeof dir, "%s", d);
	n_devices = standin_devices(dir, specs);
	return n_devices < 0 ? NVML_ERROR_DRIVER_NOT_LOADED : NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
	(void)flags;
	return nvmlInit_v2();
}

nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

const char *nvmlErrorString(nvmlReturn_t r) { return r == NVML_SUCCESS ? "Success" : "stand-in NVML error"; }

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
	if (!v) return NVML_ERROR_INVALID_ARGUMENT;
	*v = cuda_version();
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
	if (n_devices < 0) return NVML_ERROR_UNINITIALIZED;
	if (!n) return NVML_ERROR_INVALID_ARGUMENT;
	*n = (unsigned int)n_devices;
	return NVML_SUCCESS;
}

// A device handle is its index plus one.
static int index_of(nvmlDevice_t d) {
	long i = (long)(size_t)d.handle - 1;
	return i >= 0 && i < n_devices ? (int)i : -1;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
	if (n_devices < 0) return NVML_ERROR_UNINITIALIZED;
	if (!d || i >= (unsigned int)n_devices) return NVML_ERROR_INVALID_ARGUMENT;
	d->handle = (struct nvmlDevice_st *)(size_t)(i + 1);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
	int i = index_of(d);
	if (i < 0 || !name) return NVML_ERROR_INVALID_ARGUMENT;
	snprintf(name, length, "%s", specs[i].name);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
	int i = index_of(d);
	if (i < 0 || !uuid) return NVML_ERROR_INVALID_ARGUMENT;
	snprintf(uuid, length, "%s", specs[i].uuid);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, nvmlTemperatureSensors_t s, unsigned int *t) {
	(void)s;
	int i = index_of(d);
	if (i < 0 || !t) return NVML_ERROR_INVALID_ARGUMENT;
	*t = 40 + (unsigned int)i;
	return NVML_SUCCESS;
}

// Utilisation: the stand-in does no work, so it reports the share of its
// memory that processes hold, for both the GPU and its memory.
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
	int i = index_of(d);
	if (i < 0 || !u) return NVML_ERROR_INVALID_ARGUMENT;
	unsigned long long total = specs[i].total, used = total - standin_free(dir, i, total);
	u->gpu = u->memory = total ? (unsigned int)(used * 100 / total) : 0;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
	int i = index_of(d);
	if (i < 0 || !m) return NVML_ERROR_INVALID_ARGUMENT;
	m->total = specs[i].total;
	m->free = standin_free(dir, i, specs[i].total);
	m->used = m->total - m->free;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
	int i = index_of(d);
	if (i < 0 || !count) return NVML_ERROR_INVALID_ARGUMENT;
	struct standin_proc ps[STANDIN_MAX_PROCS];
	int n = standin_procs(dir, i, ps, STANDIN_MAX_PROCS);
	if ((unsigned int)n > *count) {
		*count = (unsigned int)n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	for (int k = 0; k < n; k++) {
		memset(&infos[k], 0, sizeof infos[k]);
		infos[k].pid = (unsigned int)ps[k].pid;
		infos[k].usedGpuMemory = ps[k].bytes;
		infos[k].gpuInstanceId = 0xFFFFFFFF;
		infos[k].computeInstanceId = 0xFFFFFFFF;
	}
	*count = (unsigned int)n;
	return NVML_SUCCESS;
}
