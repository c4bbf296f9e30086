/* Fuzz target: the safetensors reader (core/safetensors.c), header and data, from a temporary file. */
#include "tests/fuzz/fuzz_common.h"

#include "dsv4moe/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[320];
    snprintf(path, sizeof path, "%s/f.safetensors", fuzz_dir());
    if (fuzz_write(path, data, size))
        return 0;
    dsv4_st_file *f = NULL;
    dsv4_error err;
    dsv4_status st = dsv4_st_open(path, &f, &err);
    if (st == DSV4_OK) {
        size_t n = dsv4_st_count(f);
        unsigned acc = 0;
        for (size_t i = 0; i < n; i++) {
            const dsv4_tensor_info *t = dsv4_st_tensor(f, i);
            if (!t || dsv4_st_find(f, t->name) != t)
                abort();
            if (t->offset + t->nbytes < t->offset || t->offset + t->nbytes > size)
                abort();
            /* Touch every byte the reader vouches for. */
            const unsigned char *p = t->data;
            for (uint64_t b = 0; b < t->nbytes; b++)
                acc += p[b];
        }
        if (dsv4_st_tensor(f, n) != NULL)
            abort();
        (void)dsv4_st_metadata(f, "format");
        (void)acc;
    } else if (f != NULL || err.message[0] == '\0') {
        abort();
    }
    dsv4_st_close(f);
    unlink(path);
    return 0;
}
