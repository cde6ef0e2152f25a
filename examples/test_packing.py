"""Packing documents into one row trains like padding them, and a mask that lets them read each other is caught.

Run: python -m pytest examples/test_packing.py (or python -m unittest from examples/).
"""

import unittest

from packing import Packing

import trainparity as tp


class TestPacking(tp.TestCase):
    def test_packed_rows_train_like_padded_ones(self) -> None:
        self.assertEquivalent(Packing, Packing(packed=True))

    def test_a_causal_mask_over_a_packed_row_is_caught(self) -> None:
        result = tp.check_equivalent(Packing, Packing(packed=True, fault="causal_mask_only"))
        self.assertEqual(result.first_violation.cause if result.first_violation else None,
                         "cross_document_attention", result.report())


if __name__ == "__main__":
    unittest.main()
