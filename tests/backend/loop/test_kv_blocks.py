import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.loop.kv_blocks import BlockPool, OutOfBlocks, blocks_for_budget, kv_bytes_per_token


def test_worked_example():
    # The module docstring's example.
    pool = BlockPool(6, 4)
    assert pool.allocate(7, 6) == [0, 1] and pool.seq_len(7) == 6
    assert pool.append(7, 5) == [2] and pool.block_table(7) == [0, 1, 2]
    assert pool.truncate(7, 8) == [2] and pool.block_table(7) == [0, 1]
    assert pool.allocate(8, 9) == [2, 3, 4]
    assert pool.free(7) == 2
    assert pool.shrink(3) == [(3, 0), (4, 1)]
    assert pool.block_table(8) == [2, 0, 1]
    assert (pool.num_blocks, pool.num_free, pool.num_used) == (3, 0, 3)


def test_accounting_allocate_append_truncate_free():
    pool = BlockPool(10, 4)
    assert pool.can_allocate(40) and not pool.can_allocate(41)
    pool.allocate(1, 5)  # 2 blocks
    assert (pool.num_used, pool.num_free) == (2, 8)
    assert pool.append(1, 3) == []  # 8 tokens still fit in 2 blocks
    assert pool.append(1, 1) == [2]  # 9th token opens a block
    assert pool.seq_len(1) == 9 and pool.num_used == 3
    assert pool.locate(1, 8) == (2, 0) and pool.locate(1, 5) == (1, 1)
    assert pool.slot_mapping(1, 6, 9) == [6, 7, 8]
    assert pool.truncate(1, 8) == [2]  # exactly 2 full blocks remain
    assert pool.truncate(1, 8) == []
    assert pool.truncate(1, 0) == [0, 1] and pool.block_table(1) == []
    assert pool.num_free == 10
    pool.allocate(2, 0)
    assert pool.block_table(2) == [] and pool.can_append(2, 40) and not pool.can_append(2, 41)
    assert pool.free(1) == 0 and pool.free(2) == 0 and 1 not in pool


def test_lowest_free_block_first():
    pool = BlockPool(4, 2)
    pool.allocate(1, 2)
    pool.allocate(2, 2)
    pool.allocate(3, 2)
    pool.free(1)
    pool.free(2)
    assert pool.allocate(4, 3) == [0, 1]


def test_errors():
    pool = BlockPool(2, 4)
    with pytest.raises(OutOfBlocks):
        pool.allocate(1, 9)
    assert 1 not in pool and pool.num_free == 2  # unchanged
    pool.allocate(1, 8)
    with pytest.raises(OutOfBlocks):
        pool.append(1, 1)
    assert pool.seq_len(1) == 8 and pool.block_table(1) == [0, 1]  # unchanged
    with pytest.raises(ValueError, match="already"):
        pool.allocate(1, 1)
    with pytest.raises(ValueError, match="truncate"):
        pool.truncate(1, 9)
    with pytest.raises(OutOfBlocks):
        pool.shrink(1)  # every block is live
    with pytest.raises(IndexError):
        pool.locate(1, 8)
    with pytest.raises(KeyError):
        pool.free(99)
    with pytest.raises(ValueError):
        BlockPool(4, 0)


def test_grow_then_use_new_blocks():
    pool = BlockPool(1, 4)
    pool.allocate(1, 4)
    assert not pool.can_append(1, 1)
    pool.grow(2)
    assert pool.num_blocks == 3 and pool.append(1, 5) == [1, 2]


class Contents:
    """Simulated KV data: block -> list of token values at its offsets."""

    def __init__(self, pool: BlockPool):
        self.pool = pool
        self.blocks: dict = {}
        self.truth: dict = {}  # seq -> the tokens it wrote

    def write(self, seq_id, values):
        start = self.pool.seq_len(seq_id) - len(values)
        for i, v in enumerate(values):
            blk, off = self.pool.locate(seq_id, start + i)
            self.blocks.setdefault(blk, [None] * self.pool.block_size)[off] = v
        self.truth[seq_id] = self.truth.get(seq_id, [])[:start] + list(values)

    def apply(self, moves):
        snapshot = {old: list(self.blocks.get(old, [])) for old, _ in moves}
        for old, new in moves:
            self.blocks[new] = snapshot[old]

    def read(self, seq_id):
        return [self.blocks[b][o] for b, o in (self.pool.locate(seq_id, i) for i in range(self.pool.seq_len(seq_id)))]


def test_shrink_migration_keeps_every_sequence_intact():
    pool = BlockPool(8, 2)
    data = Contents(pool)
    for seq_id, n in ((1, 3), (2, 4), (3, 5)):  # blocks [0,1], [2,3], [4,5,6]
        pool.allocate(seq_id, n)
        data.write(seq_id, [seq_id * 100 + i for i in range(n)])
    pool.free(2)
    data.truth.pop(2)
    moves = pool.shrink(3)  # reclaim 5..7: blocks 5, 6 of sequence 3 move into the freed 2, 3
    assert moves == [(5, 2), (6, 3)]
    assert pool.block_table(3) == [4, 2, 3] and pool.num_blocks == 5 and pool.num_free == 0
    data.apply(moves)
    for seq_id, toks in data.truth.items():
        assert data.read(seq_id) == toks


def test_shrink_without_live_blocks_in_range_moves_nothing():
    pool = BlockPool(6, 4)
    pool.allocate(1, 8)
    assert pool.shrink(4) == [] and pool.num_blocks == 2 and pool.num_free == 0


def test_preemption_victims_youngest_first():
    # The docstring's example.
    pool = BlockPool(6, 1)
    for seq_id, n in ((1, 2), (2, 1), (3, 2)):
        pool.allocate(seq_id, n)
    assert pool.num_free == 1
    assert pool.preemption_victims(4, [1, 2, 3]) == [3, 2]
    assert pool.preemption_victims(1, [1, 2, 3]) == []
    assert pool.preemption_victims(3, [1, 2]) == [2, 1]  # 3 needs the room itself
    with pytest.raises(OutOfBlocks):
        pool.preemption_victims(7, [1, 2, 3])


def test_blocks_for_budget_worked_example():
    per_token = kv_bytes_per_token(num_layers=16, num_kv_heads=8, head_dim=64, dtype_bytes=2)
    assert per_token == 32768
    assert blocks_for_budget(1 << 30, per_token, 16, resident_weight_bytes=256 << 20) == 1536
    assert blocks_for_budget(1 << 20, per_token, 16, resident_weight_bytes=2 << 20) == 0
    with pytest.raises(ValueError):
        blocks_for_budget(1 << 30, 0, 16)


# --- property: random operation sequences keep the invariants ------------------------

ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "append", "truncate", "free", "shrink", "grow"]),
              st.integers(0, 5), st.integers(0, 12)),
    max_size=80,
)


def check_invariants(pool: BlockPool, data: Contents):
    owned = [b for s in pool.seq_ids() for b in pool.block_table(s)]
    assert len(owned) == len(set(owned))  # no block owned twice
    assert not set(owned) & set(pool._free)  # a live block is never free
    assert len(pool._free) == len(set(pool._free))
    assert all(0 <= b < pool.num_blocks for b in owned + pool._free)
    assert pool.num_free + pool.num_used == pool.num_blocks == len(owned) + pool.num_free
    for s in pool.seq_ids():
        assert len(pool.block_table(s)) == pool.blocks_for(pool.seq_len(s))
        assert data.read(s) == data.truth[s]


@settings(max_examples=200, deadline=None, database=None)
@given(num_blocks=st.integers(0, 12), block_size=st.integers(1, 4), program=ops)
def test_random_operations_preserve_invariants(num_blocks, block_size, program):
    pool = BlockPool(num_blocks, block_size)
    data = Contents(pool)
    stamp = 0
    for op, seq_id, n in program:
        stamp += 1
        live = seq_id in pool
        try:
            if op == "alloc" and not live:
                pool.allocate(seq_id, n)
                data.write(seq_id, [(stamp, i) for i in range(n)])
            elif op == "append" and live:
                pool.append(seq_id, n)
                data.write(seq_id, [(stamp, i) for i in range(n)])
            elif op == "truncate" and live:
                new_len = min(n, pool.seq_len(seq_id))
                pool.truncate(seq_id, new_len)
                data.truth[seq_id] = data.truth[seq_id][:new_len]
            elif op == "free" and live:
                pool.free(seq_id)
                del data.truth[seq_id]
            elif op == "shrink":
                data.apply(pool.shrink(min(n, pool.num_free + 1, pool.num_blocks)))  # +1: sometimes too many
            elif op == "grow":
                pool.grow(n)
        except OutOfBlocks:
            pass  # must leave the pool unchanged, which the invariants check
        check_invariants(pool, data)
