/*
 * Fuzz target: the checkpoint index reader (model.safetensors.index.json in
 * core/safetensors.c). The input is the index; the folder also holds two
 * small valid files, a.safetensors and b.safetensors, that it may name.
 */
#include "tests/fuzz/fuzz_common.h"

#include "dsv4moe/safetensors.h"

static const char *fixture_dir(void)
{
    static char dir[300];
    if (dir[0])
        return dir;
    snprintf(dir, sizeof dir, "%s/ckpt", fuzz_dir());
    mkdir(dir, 0700);
    static const char *const files[2] = {"a.safetensors", "b.safetensors"};
    static const char *const keys[2][2] = {{"layers.0.ffn.gate.weight", "layers.0.ffn.gate.bias"},
                                           {"layers.0.ffn.experts.0.w1.weight", "layers.0.ffn.experts.0.w2.weight"}};
    for (int i = 0; i < 2; i++) {
        dsv4_st_writer *w = NULL;
        dsv4_error err;
        float v[4] = {1, 2, 3, 4};
        int64_t shape[2] = {2, 2};
        char p[400];
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        if (dsv4_st_writer_create(&w, &err) || dsv4_st_writer_add(w, keys[i][0], DSV4_DTYPE_F32, 2, shape, v, &err) ||
            dsv4_st_writer_add(w, keys[i][1], DSV4_DTYPE_F32, 1, shape, v, &err) ||
            dsv4_st_writer_write(w, p, NULL, NULL, &err))
            abort();
        dsv4_st_writer_free(w);
    }
    return dir;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *dir = fixture_dir();
    char path[400];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (fuzz_write(path, data, size))
        return 0;
    dsv4_checkpoint *ck = NULL;
    dsv4_error err;
    dsv4_status st = dsv4_checkpoint_open(dir, &ck, &err);
    if (st == DSV4_OK) {
        size_t n = dsv4_checkpoint_tensor_count(ck);
        for (size_t i = 0; i < n; i++) {
            const dsv4_tensor_info *t = dsv4_checkpoint_tensor(ck, i);
            if (!t || dsv4_checkpoint_find(ck, t->name) != t)
                abort();
        }
        for (size_t i = 0; i < dsv4_checkpoint_file_count(ck); i++)
            if (!dsv4_checkpoint_file_path(ck, i))
                abort();
        (void)dsv4_layout_name(dsv4_checkpoint_layout(ck));
        (void)dsv4_checkpoint_prefix(ck);
    } else if (ck != NULL || err.message[0] == '\0') {
        abort();
    }
    dsv4_checkpoint_close(ck);
    return 0;
}
