"""The autocast language model's mixed precision, tested as its authors would: every matmul in bfloat16, except
the float32 attention when they choose it.

Run: python -m pytest examples/test_autocast_lm.py (or python -m unittest from examples/).
"""

import unittest

from autocast_lm import AutocastLM

import trainparity as tp


class TestAutocastLM(tp.TestCase):
    def test_every_matmul_runs_in_bfloat16(self) -> None:
        self.assertMixedPrecisionSafe(AutocastLM, steps=2)

    def test_a_deliberate_float32_attention_is_allowed_by_name(self) -> None:
        self.assertMixedPrecisionSafe(AutocastLM(fault="attention_in_float32"), steps=2, allow_float32=("attn",))

    def test_autocast_turned_off_by_a_config_flag_fails(self) -> None:
        result = tp.check_mixed_precision(AutocastLM(fault="amp_flag_off"), steps=1)
        first = result.first_violation
        assert first is not None, result.report()
        self.assertEqual((first.path, first.kind), ("autocast.AutocastLM.step", "autocast_ineffective"))


if __name__ == "__main__":
    unittest.main()
