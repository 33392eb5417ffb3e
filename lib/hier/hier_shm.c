/* hier_shm.c: the steps inside a host of the hierarchical allreduce through one POSIX
 * shared-memory segment of the host's ranks instead of loopback messages: each rank
 * copies its input into its slot once, and each reduces its own part straight from every
 * slot (the copies a loopback reduce-scatter and allgather make in the kernel, and their
 * progress threads' wake-ups, are what make them cost on a host with few cores). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hier/hier.h"
#include "base/log.h"
#include "collectives/reduce.h"
#include "base/util.h"

void gcoll_hier_shm_free(gcoll_hier_t *h)
{
    if (h->shm)
        munmap(h->shm, h->shm_slot * (size_t)h->local_size);
    h->shm = NULL;
    h->shm_slot = 0;
}

/* Local rank 0 creates the segment and tells the others its name; all map it, then it is
 * unlinked, so that it goes away with the last rank whatever happens to the job. */
static gcoll_status_t shm_make(gcoll_hier_t *h, size_t slot)
{
    static unsigned counter;
    char name[64] = "";
    size_t total = slot * (size_t)h->local_size;
    int fd = -1;
    if (h->local_rank == 0) {
        snprintf(name, sizeof(name), "/gcoll-hier-%ld-%u", (long)getpid(),
                 __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0 || ftruncate(fd, (off_t)total) != 0) {
            GCOLL_INFO(GCOLL_SUBSYS_COLL,
                       "hierarchy: no shared memory segment of %zu bytes "
                       "(%m): loopback inside the host",
                       total);
            if (fd >= 0) {
                close(fd);
                shm_unlink(name);
            }
            fd = -1;
            name[0] = '\0';
        }
    }
    GCOLL_CHECK(gcoll_broadcast(h->local, name, sizeof(name) / 4, GCOLL_INT32, 0));
    name[sizeof(name) - 1] = '\0';
    int32_t bad = name[0] == '\0';
    void *p = MAP_FAILED;
    if (!bad) {
        if (h->local_rank != 0)
            fd = shm_open(name, O_RDWR, 0600);
        if (fd >= 0)
            p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (fd >= 0)
            close(fd);
        bad = p == MAP_FAILED;
    }
    gcoll_status_t st = gcoll_allreduce(h->local, &bad, &bad, 1, GCOLL_INT32, GCOLL_MAX);
    if (h->local_rank == 0 && name[0])
        shm_unlink(name); /* every rank has it mapped (or gave up) by now */
    if (st != GCOLL_OK || bad) {
        if (p != MAP_FAILED)
            munmap(p, total);
        if (st == GCOLL_OK)
            h->shm_off = 1;
        return st;
    }
    h->shm = p;
    h->shm_slot = slot;
    return GCOLL_OK;
}

gcoll_status_t gcoll_hier_shm_ensure(gcoll_hier_t *h, size_t slot_bytes, int *ok_p)
{
    *ok_p = 0;
    if (h->shm_off || !h->uniform || h->local_size < 2)
        return GCOLL_OK;
    if (!h->shm || h->shm_slot < slot_bytes) {
        gcoll_hier_shm_free(h);
        size_t slot = (slot_bytes + 4095) / 4096 * 4096;
        GCOLL_CHECK(shm_make(h, slot ? slot : 4096));
    }
    *ok_p = h->shm != NULL;
    return GCOLL_OK;
}

gcoll_status_t gcoll_hier_shm_reduce_scatter(gcoll_hier_t *h, const void *in, void *out,
                                             size_t part, gcoll_dtype_t dtype, gcoll_op_t op)
{
    const size_t esz = gcoll_dtype_size(dtype), L = (size_t)h->local_size;
    const size_t lr = (size_t)h->local_rank, pb = part * esz;
    memcpy(h->shm + lr * h->shm_slot, in, L * pb);
    GCOLL_CHECK(gcoll_barrier(h->local)); /* every slot is written */
    uint8_t *mine = (uint8_t *)out + lr * pb;
    memcpy(mine, h->shm + lr * pb, pb); /* slot 0's part, then the others in order */
    for (size_t j = 1; j < L; j++)
        gcoll_reduce_local(mine, h->shm + j * h->shm_slot + lr * pb, part, dtype, op);
    return GCOLL_OK;
}

gcoll_status_t gcoll_hier_shm_allgather(gcoll_hier_t *h, void *out, size_t part,
                                        gcoll_dtype_t dtype)
{
    const size_t esz = gcoll_dtype_size(dtype), L = (size_t)h->local_size;
    const size_t lr = (size_t)h->local_rank, pb = part * esz;
    /* slot 0's part lr is read by rank lr alone (its reduce-scatter, done): its result
     * goes there */
    memcpy(h->shm + lr * pb, (uint8_t *)out + lr * pb, pb);
    GCOLL_CHECK(gcoll_barrier(h->local)); /* every part is published */
    for (size_t j = 0; j < L; j++)
        if (j != lr)
            memcpy((uint8_t *)out + j * pb, h->shm + j * pb, pb);
    /* nobody writes its next input into slot 0 before everyone has read this result */
    return gcoll_barrier(h->local);
}
