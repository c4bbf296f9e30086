/*
 * Plain driver for the fuzz targets: feeds each file named on the command
 * line (folders are walked, one level of files) to LLVMFuzzerTestOneInput.
 * Built with the ordinary compiler, so `make test` replays the corpus and
 * the crash reproducers without clang. Exit 0 when every input returned.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz-replay: cannot open %s\n", path);
        return 1;
    }
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            uint8_t *nb = realloc(buf, cap *= 2);
            if (!nb)
                free(buf);
            buf = nb;
        }
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "fuzz-replay: out of memory reading %s\n", path);
        return 1;
    }
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int bad = 0;
    size_t count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb)) {
            fprintf(stderr, "fuzz-replay: no such input %s\n", argv[i]);
            bad = 1;
            continue;
        }
        if (!S_ISDIR(sb.st_mode)) {
            bad |= run_file(argv[i]);
            count++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *de;
        while (d && (de = readdir(d))) {
            if (de->d_name[0] == '.')
                continue;
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[i], de->d_name);
            if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode)) {
                bad |= run_file(p);
                count++;
            }
        }
        if (d)
            closedir(d);
    }
    printf("%zu inputs replayed\n", count);
    return bad;
}
