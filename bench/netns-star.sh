# netns-star.sh: sourced by the benches that put N ranks in N network namespaces joined
# through a bridge in one more namespace, every veth shaped with tc tbf at RATE in both
# directions (ddp-tta.sh, fsdp-speed.sh). The caller sets N, RATE, NS (the namespaces'
# prefix), VETH (the veths' prefix), SUBNET (e.g. 10.79.0: rank i is SUBNET.(i+1)) and a
# skip function, and calls star_cleanup on exit.

star_cleanup() {
    for i in $(seq 0 $((N - 1))); do ip netns del "$NS$i" 2>/dev/null; done
    ip netns del "${NS}br" 2>/dev/null
}

star_make() {
    star_cleanup
    ip netns add "${NS}br" || skip "cannot create network namespaces here"
    ip -n "${NS}br" link add br0 type bridge && ip -n "${NS}br" link set br0 up ||
        skip "cannot create a bridge"
    for i in $(seq 0 $((N - 1))); do
        ip netns add "$NS$i" || skip "cannot create namespace $NS$i"
        ip link add "$VETH$i" netns "$NS$i" type veth peer name "${VETH}b$i" netns "${NS}br" ||
            skip "cannot create veth"
        ip -n "$NS$i" addr add "$SUBNET.$((i + 1))/24" dev "$VETH$i"
        ip -n "$NS$i" link set "$VETH$i" up
        ip -n "$NS$i" link set lo up
        ip -n "${NS}br" link set "${VETH}b$i" master br0
        ip -n "${NS}br" link set "${VETH}b$i" up
        for where in "$NS$i $VETH$i" "${NS}br ${VETH}b$i"; do
            # shellcheck disable=SC2086
            set -- $where
            tc -n "$1" qdisc replace dev "$2" root tbf rate "$RATE" burst 512kb latency 100ms ||
                skip "tc tbf is not available"
        done
    done
}
