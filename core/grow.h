/*
 * Internal (not installed): the growth step of the library's dynamic arrays (a checkpoint's file
 * names, the safetensors writer's tensors and metadata, the collective trace, the harness's cases,
 * a trace's entries, the string buffer): one copy of the doubling and of the overflow check
 * that each of them had written out.
 */
#ifndef DSV4MOE_CORE_GROW_H
#define DSV4MOE_CORE_GROW_H

#include <stdint.h>
#include <stdlib.h>

/*
 * The array p of *cap elements of `size` bytes with room for at least `need` (>= 1): p itself
 * when it has it, else p reallocated to *cap doubled (from `first` >= 1 when *cap is 0) until it
 * holds `need`, and *cap set to that. NULL when the allocation fails or the byte count would
 * overflow size_t: p and *cap are then unchanged and p still belongs to the caller.
 */
static inline void *dsv4_grow(void *p, size_t *cap, size_t need, size_t size, size_t first)
{
    if (need <= *cap)
        return p;
    size_t c = *cap ? *cap : first;
    while (c < need) {
        if (c > SIZE_MAX / 2)
            return NULL;
        c *= 2;
    }
    if (c > SIZE_MAX / size)
        return NULL;
    void *q = realloc(p, c * size);
    if (q)
        *cap = c;
    return q;
}

#endif
