#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/alloc.h"
#include "core/err.h"

struct dsv4_allocator {
    pthread_mutex_t mu;
    dsv4_alloc_stats s;
};

/* Each block carries its size in a header, aligned for any type. */
typedef union {
    uint64_t size;
    max_align_t align;
} header;

dsv4_status dsv4_allocator_create(uint64_t limit, dsv4_allocator **out, dsv4_error *err)
{
    if (!out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "allocator", "out must not be NULL");
    dsv4_allocator *a = calloc(1, sizeof *a);
    if (!a)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "allocator", "out of memory");
    if (pthread_mutex_init(&a->mu, NULL)) {
        free(a);
        return dsv4_seterr(err, DSV4_ERR_INTERNAL, "allocator", "cannot create its mutex");
    }
    a->s.limit = limit;
    *out = a;
    return DSV4_OK;
}

void dsv4_allocator_free(dsv4_allocator *a)
{
    if (!a)
        return;
    pthread_mutex_destroy(&a->mu);
    free(a);
}

void *dsv4_alloc(dsv4_allocator *a, size_t bytes)
{
    if (bytes > SIZE_MAX - sizeof(header)) {
        if (a) {
            pthread_mutex_lock(&a->mu);
            a->s.refused++;
            pthread_mutex_unlock(&a->mu);
        }
        return NULL;
    }
    if (!a)
        return calloc(1, bytes ? bytes : 1);
    pthread_mutex_lock(&a->mu);
    bool over = a->s.limit && (bytes > a->s.limit || a->s.current > a->s.limit - bytes);
    if (over) {
        a->s.refused++;
        pthread_mutex_unlock(&a->mu);
        return NULL;
    }
    a->s.current += bytes; /* reserve before allocating, so concurrent callers see the limit */
    pthread_mutex_unlock(&a->mu);
    header *h = calloc(1, sizeof(header) + bytes);
    pthread_mutex_lock(&a->mu);
    if (!h) {
        a->s.current -= bytes;
        a->s.refused++;
    } else {
        h->size = bytes;
        a->s.total += bytes;
        a->s.count++;
        if (a->s.current > a->s.peak)
            a->s.peak = a->s.current;
    }
    pthread_mutex_unlock(&a->mu);
    return h ? (void *)(h + 1) : NULL;
}

void dsv4_release(dsv4_allocator *a, void *p)
{
    if (!p)
        return;
    if (!a) {
        free(p);
        return;
    }
    header *h = (header *)p - 1;
    pthread_mutex_lock(&a->mu);
    a->s.current -= h->size;
    pthread_mutex_unlock(&a->mu);
    free(h);
}

dsv4_alloc_stats dsv4_allocator_stats(const dsv4_allocator *a)
{
    dsv4_alloc_stats s;
    memset(&s, 0, sizeof s);
    if (!a)
        return s;
    pthread_mutex_lock((pthread_mutex_t *)&a->mu);
    s = a->s;
    pthread_mutex_unlock((pthread_mutex_t *)&a->mu);
    return s;
}

void dsv4_allocator_reset_peak(dsv4_allocator *a)
{
    if (!a)
        return;
    pthread_mutex_lock(&a->mu);
    a->s.peak = a->s.current;
    pthread_mutex_unlock(&a->mu);
}
