"""pipeline.long_lived_heap: the collector's settings are back as they were after the block."""

import gc

from dtype_doctor.pipeline import long_lived_heap


def test_heap_restored_after_the_block() -> None:
    before = gc.get_threshold()
    with long_lived_heap():
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold()[2] >= 1_000_000  # no full pass inside
        gc.collect(0)  # the young generation is still collected
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_heap_restored_when_the_block_raises() -> None:
    before = gc.get_threshold()
    try:
        with long_lived_heap():
            raise ValueError("boom")
    except ValueError:
        pass
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_a_caller_policy_is_kept() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        # Frozen objects still die by reference count (the count can only fall), so: not frozen
        # again by the block (no rise), and not unfrozen by it (not emptied).
        with long_lived_heap():
            assert 0 < gc.get_freeze_count() <= frozen
        assert 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()
