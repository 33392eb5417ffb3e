/* ibvwrap.h: the one place gcoll calls libibverbs: a table of function pointers filled by
 * dlopen at run time (as NCCL's ibvwrap), which unit tests replace with a fake device. */
#ifndef GCOLL_IBVWRAP_H
#define GCOLL_IBVWRAP_H

#include <stddef.h>

#include <infiniband/verbs.h>

#include "gcoll.h"

/* Every verb the verbs transport uses. Field names drop the ibv_ prefix: several ibv_*
 * names are function-like macros or static inlines in <infiniband/verbs.h>. Each entry
 * has the semantics of the verb it is named after (return values and errno included). */
typedef struct gcoll_ibv_ops {
    struct ibv_device **(*get_device_list)(int *num_devices);
    void (*free_device_list)(struct ibv_device **list);
    const char *(*get_device_name)(struct ibv_device *device);
    struct ibv_context *(*open_device)(struct ibv_device *device);
    int (*close_device)(struct ibv_context *context);
    int (*query_device)(struct ibv_context *context, struct ibv_device_attr *attr);
    int (*query_port)(struct ibv_context *context, uint8_t port, struct ibv_port_attr *attr);
    int (*query_gid)(struct ibv_context *context, uint8_t port, int index, union ibv_gid *gid);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *context);
    int (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access);
    int (*dereg_mr)(struct ibv_mr *mr);
    struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *context);
    int (*destroy_comp_channel)(struct ibv_comp_channel *channel);
    struct ibv_cq *(*create_cq)(struct ibv_context *context, int cqe, void *cq_context,
                                struct ibv_comp_channel *channel, int comp_vector);
    int (*destroy_cq)(struct ibv_cq *cq);
    int (*get_cq_event)(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context);
    void (*ack_cq_events)(struct ibv_cq *cq, unsigned int nevents);
    int (*req_notify_cq)(struct ibv_cq *cq, int solicited_only);
    int (*poll_cq)(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
    struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask);
    int (*destroy_qp)(struct ibv_qp *qp);
    int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
    int (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
    const char *(*wc_status_str)(enum ibv_wc_status status);
} gcoll_ibv_ops_t;

/* The verbs in use: libibverbs.so.1 loaded on first call (once per process), or the table
 * installed by gcoll_ibv_override. On failure returns GCOLL_ERR_UNSUPPORTED with the reason
 * ("libibverbs.so.1 not found: ...") in why. Thread safe; never blocks for long. */
gcoll_status_t gcoll_ibv_get(const gcoll_ibv_ops_t **ops_p, char *why, size_t whylen);

/* Test seam: every later gcoll_ibv_get returns ops (NULL: back to the real library). The
 * table must outlive its use. Not thread safe against concurrent gcoll_ibv_get. */
void gcoll_ibv_override(const gcoll_ibv_ops_t *ops);

#endif /* GCOLL_IBVWRAP_H */
