/*
 * Shared helpers of the fuzz targets (tests/fuzz/fuzz_*.c). Each target
 * defines LLVMFuzzerTestOneInput; it is linked either with libFuzzer
 * (`make fuzz`, clang) or with driver.c (`make test` replays the corpus
 * and the reproducers with gcc).
 */
#ifndef DSV4_FUZZ_COMMON_H
#define DSV4_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A private scratch folder for this process (tmpfs when there is one, for speed). */
static inline const char *fuzz_dir(void)
{
    static char dir[256];
    if (!dir[0]) {
        const char *base = getenv("DSV4_FUZZ_TMP");
        if (!base)
            base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(dir, sizeof dir, "%s/dsv4fuzz.%ld", base, (long)getpid());
        mkdir(dir, 0700);
    }
    return dir;
}

/* Writes data to dir/name; returns 0 on success. */
static inline int fuzz_write(const char *path, const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = size == 0 || fwrite(data, 1, size, f) == size;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* A NUL-terminated copy of the input (NULL when out of memory). */
static inline char *fuzz_cstr(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (s) {
        if (size)
            memcpy(s, data, size);
        s[size] = '\0';
    }
    return s;
}

#endif
