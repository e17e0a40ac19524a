/* The site benchmark's storm worker, built once per storm with
 * -DSTORM_CPU, -DSTORM_IO or -DSTORM_MEMORY. It works for
 * $BENCH_JOB_SECONDS of wall time (3 by default) in units of work and
 * appends one byte to the file $BENCH_UNITS for each unit done, so that the
 * file's size is the work the storm has done.
 *
 * CPU:    a unit is a fixed run of integer hashing (a few milliseconds).
 * I/O:    a unit is 64 KiB written to a file in the working directory (the
 *         job's scratch directory) and fdatasync'd, over a 16 MiB ring.
 * Memory: a unit is 64 MiB of pages written: the job grows to
 *         $BENCH_MEMORY_MIB (2048 by default) 64 MiB at a time, then writes
 *         its memory over again until its time is up. */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static long env_long(const char *name, long fallback) {
    const char *value = getenv(name);
    return value && *value ? atol(value) : fallback;
}

static int units = -1;

static void unit_done(void) {
    if (units >= 0 && write(units, "u", 1) != 1) exit(1);
}

#if defined(STORM_CPU)
static volatile uint64_t sink;

static int work(double end) {
    uint64_t x = (uint64_t)getpid();
    while (now() < end) {
        for (long i = 0; i < 2000000; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            x ^= x >> 29;
        }
        sink = x;
        unit_done();
    }
    return 0;
}
#elif defined(STORM_IO)
static int work(double end) {
    enum { BLOCK = 64 << 10, RING = 256 };
    static char block[BLOCK];
    memset(block, 'j', sizeof block);
    int fd = open("storm.dat", O_WRONLY | O_CREAT, 0600);
    if (fd < 0) return 1;
    for (long n = 0; now() < end; n++) {
        if (pwrite(fd, block, BLOCK, (off_t)(n % RING) * BLOCK) != BLOCK) return 1;
        if (fdatasync(fd) != 0) return 1;
        unit_done();
    }
    return close(fd);
}
#elif defined(STORM_MEMORY)
static int work(double end) {
    const size_t step = (size_t)64 << 20;
    size_t steps = (size_t)env_long("BENCH_MEMORY_MIB", 2048) / 64;
    if (steps == 0) steps = 1;
    char **chunks = calloc(steps, sizeof *chunks);
    if (!chunks) return 1;
    size_t held = 0;
    for (size_t n = 0; now() < end; n++) {
        char *chunk;
        if (held < steps) {
            chunk = chunks[held++] = malloc(step);
            if (!chunk) return 1;
        } else {
            chunk = chunks[n % steps];
        }
        for (size_t at = 0; at < step; at += 4096) chunk[at] = (char)n;
        unit_done();
    }
    return 0;
}
#else
#error "build with -DSTORM_CPU, -DSTORM_IO or -DSTORM_MEMORY"
#endif

int main(void) {
    double end = now() + (double)env_long("BENCH_JOB_SECONDS", 3);
    const char *path = getenv("BENCH_UNITS");
    if (path) units = open(path, O_WRONLY | O_APPEND);
    return work(end);
}
