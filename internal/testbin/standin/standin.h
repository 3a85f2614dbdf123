// What the stand-in GPU backend (backend.c) and the stand-in NVML (nvml.c)
// share: the devices file and the per-process memory files of the
// stand-in's directory.
#ifndef STANDIN_H
#define STANDIN_H

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STANDIN_DIR_ENV "APIARY_STANDIN_GPU_DIR"
#define STANDIN_MAX_DEVICES 8
#define STANDIN_MAX_PROCS 256

struct standin_spec {
	size_t total;
	char uuid[96];
	char name[96];
};

struct standin_proc {
	int pid;
	size_t bytes;
};

// standin_devices reads dir/devices ("TOTAL_BYTES UUID NAME" a line) into
// specs; it returns the number of devices, or -1.
static int standin_devices(const char *dir, struct standin_spec *specs) {
	char path[4200], line[512];
	snprintf(path, sizeof path, "%s/devices", dir);
	FILE *f = fopen(path, "r");
	if (!f) return -1;
	int n = 0;
	while (n < STANDIN_MAX_DEVICES && fgets(line, sizeof line, f)) {
		struct standin_spec *s = &specs[n];
		int used = 0;
		if (sscanf(line, "%zu %95s %n", &s->total, s->uuid, &used) < 2) continue;
		snprintf(s->name, sizeof s->name, "%s", line + used);
		s->name[strcspn(s->name, "\n")] = 0;
		n++;
	}
	fclose(f);
	return n;
}

// standin_alive says whether pid is a running process (not a zombie): the
// driver frees a process's memory when it ends.
static int standin_alive(int pid) {
	char path[64], buf[512];
	snprintf(path, sizeof path, "/proc/%d/stat", pid);
	FILE *f = fopen(path, "r");
	if (!f) return 0;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	char *p = strrchr(buf, ')');
	return p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

// standin_procs lists the live processes holding memory on device index;
// it returns how many (at most max).
static int standin_procs(const char *dir, int index, struct standin_proc *out, int max) {
	DIR *d = opendir(dir);
	if (!d) return 0;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) && n < max) {
		int dev, pid, used = 0;
		if (sscanf(e->d_name, "dev%d.%d%n", &dev, &pid, &used) != 2 || e->d_name[used] != 0 || dev != index) continue;
		if (!standin_alive(pid)) continue;
		char path[4400];
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		FILE *f = fopen(path, "r");
		if (!f) continue;
		size_t bytes = 0;
		if (fscanf(f, "%zu", &bytes) == 1 && bytes > 0) {
			out[n].pid = pid;
			out[n].bytes = bytes;
			n++;
		}
		fclose(f);
	}
	closedir(d);
	return n;
}

// standin_free is device index's total less what its live processes hold.
static size_t standin_free(const char *dir, int index, size_t total) {
	struct standin_proc ps[STANDIN_MAX_PROCS];
	int n = standin_procs(dir, index, ps, STANDIN_MAX_PROCS);
	size_t used = 0;
	for (int i = 0; i < n; i++) used += ps[i].bytes;
	return used >= total ? 0 : total - used;
}

#endif
