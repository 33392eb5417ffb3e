/* fake_verbs.h: an in-memory RDMA "device" installed behind gcoll's ibv wrapper. It
 * checks what real verbs check (QP state machine and required attributes, lkey/rkey
 * bounds and access, max_msg_sz, posted receives) and moves bytes with memcpy. It tests
 * gcoll's logic, not any hardware or driver. */
#ifndef FAKE_VERBS_H
#define FAKE_VERBS_H

#include <stdint.h>

#include "transports/verbs/ibvwrap.h"

enum { FAKE_LIST_OK, FAKE_LIST_ENOSYS, FAKE_LIST_EMPTY };

typedef struct {
    int list_mode;                     /* FAKE_LIST_* */
    int ndev;                          /* devices named fake_0, fake_1, ... */
    int nports;                        /* ports per device */
    enum ibv_port_state port_state[4]; /* of ports 1..4 (ACTIVE by default) */
    uint8_t link_layer;                /* IBV_LINK_LAYER_INFINIBAND or _ETHERNET */
    uint32_t max_msg_sz;
    enum ibv_mtu active_mtu;
    int max_qp_wr, max_cqe;
} fake_verbs_cfg_t;

extern fake_verbs_cfg_t fake_cfg;

/* What the fake saw of one QP. */
typedef struct {
    uint32_t qpn;
    enum ibv_qp_state state;
    struct ibv_qp_attr init, rtr, rts;
    int init_mask, rtr_mask, rts_mask;
    int seq_init, seq_first_recv, seq_rtr, seq_rts, seq_first_send; /* event order, 0 = never */
    uint32_t max_send_wr, max_recv_wr;
} fake_qp_info_t;

typedef struct {
    uint64_t writes, write_bytes, max_write; /* RDMA writes delivered */
    uint64_t reg_mr, dereg_mr;               /* calls */
    int live_mr, live_qp, live_cq, live_ctx; /* objects not yet destroyed */
    int cq_overflow, rnr;                    /* must stay 0 */
    int bad_transitions;                     /* modify_qp calls refused */
    int seq_create_cq, seq_first_qp;
} fake_stats_t;

extern fake_stats_t fake_stats;

/* Resets the device to defaults and installs it behind gcoll_ibv_get. */
void fake_verbs_install(void);
/* Back to the real libibverbs. */
void fake_verbs_uninstall(void);
/* The next n send work requests complete with status (and put their QP in error). */
void fake_verbs_fail_sends(int n, enum ibv_wc_status status);
/* While held, posted writes wait in flight until fake_verbs_release, which delivers at
 * most max of them (max < 0: all), oldest first or with reverse newest first (as writes
 * on different QPs may land). Returns writes delivered. */
void fake_verbs_hold(int on);
int fake_verbs_release(int reverse, int max);
/* Makes a receive completion appear on qpn as if a write with immediate of byte_len
 * bytes had landed (the test writes the bytes itself). 0, or -1 without a posted receive. */
int fake_verbs_inject_recv(uint32_t qpn, uint32_t imm, uint32_t byte_len);
/* QP records in creation order; NULL past the end. */
const fake_qp_info_t *fake_verbs_qp(int i);
const fake_qp_info_t *fake_verbs_qp_by_num(uint32_t qpn);
/* Whether an MR with this rkey is registered. */
int fake_verbs_rkey_live(uint32_t rkey);

#endif /* FAKE_VERBS_H */
