"""SGLang arguments for an engine whose ranks span several nodes (rollout.engine_nnodes > 1).

SGLang runs one engine over nodes as nnodes engine processes, one per node, each starting the schedulers of
that node's TP ranks; they rendezvous at dist_init_addr (an address:port on the first node) and only the
first node's process (node_rank 0, the engine's owner here) serves requests. No launcher is involved: the
owner picks a free port on its host and publishes the address in the job's c10d store, and every other
node's first engine rank reads it from there (a bounded wait), so all of an engine's processes are started
by the trainer ranks themselves, as single-node engines are. A restarted engine (EngineRestarts.revive_dead_engines:
every node's share restarts together) rendezvouses at a new address under a new key: the old one is
still in the store and names processes that are gone.
"""

import socket

from torch.distributed import distributed_c10d


def node_args(placement, engine: int, node_rank: int, timeout_s: float, start: int = 0) -> dict:
    """SGLang ServerArgs fields for `node_rank`'s share of engine `engine` (collective among its node ranks)
    at its start number `start` (0: the first start; n: the n-th restart in this attempt)."""
    store = distributed_c10d._get_default_store()
    key = f"distflow/engine{engine}/start{start}/dist_init_addr"
    if node_rank == 0:
        address = f"{host_address()}:{_free_port()}"
        store.set(key, address)
    else:
        try:  # the store's own timeout bounds the wait: trainer.dist_timeout_s
            address = store.get(key).decode()
        except Exception as exc:  # a c10d timeout or a closed store: say which engine never started
            owner = placement.engine_ranks(engine)[0]
            raise TimeoutError(
                f"engine {engine} node {node_rank}: the owner (rank {owner}) published no "
                f"rendezvous address within {timeout_s:.0f} s ({exc})"
            ) from exc
    return {"nnodes": placement.engine_nnodes, "node_rank": node_rank, "dist_init_addr": address}


def host_address() -> str:
    """This host's address as other nodes reach it (its name's address; loopback on a host without one)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
