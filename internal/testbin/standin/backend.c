// A stand-in GPU backend for apiary's tests: a ggml backend library
// (loaded by a worker as its CUDA backend, libggml-cuda.so) that registers
// GPU devices whose buffers live in host memory and whose compute runs on
// ggml's CPU backend. A model offloaded to it is truly offloaded: its
// layers are placed in this device's buffers, and the scheduler runs their
// operations on this device's backend. It binds to the worker's own ggml,
// as the real CUDA backend does, and reaches the CPU backend through
// ggml's registry only (the CPU backend may itself be a library ggml
// loaded).
//
// The devices and their memory come from $APIARY_STANDIN_GPU_DIR/devices,
// one line per device: "TOTAL_BYTES UUID NAME". The memory this process
// holds on device N is kept in $APIARY_STANDIN_GPU_DIR/dev<N>.<pid> (written
// at every allocation and free, replaced atomically), which the stand-in
// NVML (nvml.c) reads as the driver's process list; a device's free memory
// is its total less what every live process holds there.
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ggml-backend-impl.h"

#include "standin.h"

struct standin_dev {
	int index;
	char name[32];
	char description[128];
	size_t total;
	size_t held; // bytes this process holds on the device
	struct ggml_backend_device dev;
	struct ggml_backend_buffer_type buft;
};

static struct standin_dev devices[STANDIN_MAX_DEVICES];
static int n_devices;
static struct ggml_backend_reg reg;
static char dir[4096];
static void (*cpu_free_buffer)(ggml_backend_buffer_t);

// cpu is ggml's CPU device.
static ggml_backend_dev_t cpu(void) { return ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU); }

static struct standin_dev *of_dev(ggml_backend_dev_t d) { return (struct standin_dev *)d->context; }
static struct standin_dev *of_buft(ggml_backend_buffer_type_t b) { return (struct standin_dev *)b->context; }

// record writes what this process holds on d for the stand-in driver.
static void record(struct standin_dev *d) {
	char path[4200], tmp[4300];
	snprintf(path, sizeof path, "%s/dev%d.%d", dir, d->index, (int)getpid());
	if (d->held == 0) {
		unlink(path);
		return;
	}
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f) return;
	fprintf(f, "%zu\n", d->held);
	fclose(f);
	rename(tmp, path);
}

// --- buffers: the CPU backend's, counted against the device ---

static void buffer_free(ggml_backend_buffer_t b) {
	struct standin_dev *d = of_buft(b->buft);
	size_t size = b->size;
	cpu_free_buffer(b);
	d->held = d->held > size ? d->held - size : 0;
	record(d);
}

static const char *buft_name(ggml_backend_buffer_type_t b) { return of_buft(b)->name; }

static ggml_backend_buffer_t buft_alloc(ggml_backend_buffer_type_t b, size_t size) {
	struct standin_dev *d = of_buft(b);
	size_t free_bytes = standin_free(dir, d->index, d->total);
	if (size > free_bytes) {
		fprintf(stderr, "standin: %s: out of memory: %zu bytes asked, %zu free\n", d->name, size, free_bytes);
		return NULL;
	}
	ggml_backend_buffer_t buf = ggml_backend_buft_alloc_buffer(ggml_backend_dev_buffer_type(cpu()), size);
	if (!buf) return NULL;
	cpu_free_buffer = buf->iface.free_buffer;
	buf->iface.free_buffer = buffer_free;
	buf->buft = b;
	d->held += buf->size;
	record(d);
	return buf;
}

static size_t buft_alignment(ggml_backend_buffer_type_t b) {
	(void)b;
	return ggml_backend_buft_get_alignment(ggml_backend_dev_buffer_type(cpu()));
}

static bool buft_is_host(ggml_backend_buffer_type_t b) {
	(void)b;
	return true;
}

// --- devices ---

static const char *dev_name(ggml_backend_dev_t d) { return of_dev(d)->name; }
static const char *dev_description(ggml_backend_dev_t d) { return of_dev(d)->description; }

static void dev_memory(ggml_backend_dev_t d, size_t *free_bytes, size_t *total) {
	struct standin_dev *s = of_dev(d);
	*total = s->total;
	*free_bytes = standin_free(dir, s->index, s->total);
}

static enum ggml_backend_dev_type dev_type(ggml_backend_dev_t d) {
	(void)d;
	return GGML_BACKEND_DEVICE_TYPE_GPU;
}

static void dev_props(ggml_backend_dev_t d, struct ggml_backend_dev_props *p) {
	struct standin_dev *s = of_dev(d);
	memset(p, 0, sizeof *p);
	p->name = s->name;
	p->description = s->description;
	p->type = GGML_BACKEND_DEVICE_TYPE_GPU;
	dev_memory(d, &p->memory_free, &p->memory_total);
}

// A backend of the device is a CPU backend that names this device as its
// own: the scheduler runs on it the operations whose weights are in this
// device's buffers.
static ggml_backend_t dev_init(ggml_backend_dev_t d, const char *params) {
	(void)params;
	ggml_backend_t b = ggml_backend_dev_init(cpu(), NULL);
	if (b) b->device = d;
	return b;
}

static ggml_backend_buffer_type_t dev_buft(ggml_backend_dev_t d) { return &of_dev(d)->buft; }

static bool dev_supports_op(ggml_backend_dev_t d, const struct ggml_tensor *op) {
	(void)d;
	return ggml_backend_dev_supports_op(cpu(), op);
}

static bool dev_supports_buft(ggml_backend_dev_t d, ggml_backend_buffer_type_t b) { return b == &of_dev(d)->buft; }

static const struct ggml_backend_device_i dev_iface = {
	.get_name = dev_name,
	.get_description = dev_description,
	.get_memory = dev_memory,
	.get_type = dev_type,
	.get_props = dev_props,
	.init_backend = dev_init,
	.get_buffer_type = dev_buft,
	.supports_op = dev_supports_op,
	.supports_buft = dev_supports_buft,
};

static const struct ggml_backend_buffer_type_i buft_iface = {
	.get_name = buft_name,
	.alloc_buffer = buft_alloc,
	.get_alignment = buft_alignment,
	.is_host = buft_is_host,
};

// --- the registry ---

static const char *reg_name(ggml_backend_reg_t r) {
	(void)r;
	return "Standin";
}
static size_t reg_count(ggml_backend_reg_t r) {
	(void)r;
	return (size_t)n_devices;
}
static ggml_backend_dev_t reg_get(ggml_backend_reg_t r, size_t i) {
	(void)r;
	return i < (size_t)n_devices ? &devices[i].dev : NULL;
}

// The device's backends are CPU backends: the CPU's own functions set
// their threads and abort callback.
static void *reg_proc(ggml_backend_reg_t r, const char *name) {
	(void)r;
	if (strcmp(name, "ggml_backend_set_n_threads") == 0 || strcmp(name, "ggml_backend_set_abort_callback") == 0) {
		return ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(cpu()), name);
	}
	return NULL;
}

ggml_backend_reg_t ggml_backend_init(void) {
	const char *d = getenv(STANDIN_DIR_ENV);
	if (!d || !*d) {
		fprintf(stderr, "standin: %s is not set\n", STANDIN_DIR_ENV);
		return NULL;
	}
	snprintf(dir, sizeof dir, "%s", d);
	struct standin_spec specs[STANDIN_MAX_DEVICES];
	int n = standin_devices(dir, specs);
	if (n < 0) {
		fprintf(stderr, "standin: cannot read %s/devices\n", dir);
		return NULL;
	}
	for (int i = 0; i < n; i++) {
		struct standin_dev *s = &devices[i];
		s->index = i;
		snprintf(s->name, sizeof s->name, "Standin%d", i);
		snprintf(s->description, sizeof s->description, "%s", specs[i].name);
		s->total = specs[i].total;
		s->dev.iface = dev_iface;
		s->dev.reg = &reg;
		s->dev.context = s;
		s->buft.iface = buft_iface;
		s->buft.device = &s->dev;
		s->buft.context = s;
	}
	n_devices = n;
	reg.api_version = GGML_BACKEND_API_VERSION;
	reg.iface.get_name = reg_name;
	reg.iface.get_device_count = reg_count;
	reg.iface.get_device = reg_get;
	reg.iface.get_proc_address = reg_proc;
	reg.context = NULL;
	return &reg;
}
