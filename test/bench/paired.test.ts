/**
 * The bench's paired statistics (bench/lib/paired.ts) against values worked out by hand: the sign-test interval's
 * order statistics and exact coverage from the binomial distribution, medians of odd and even counts, signs with
 * ties left out.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { mean, median, medianInterval, signs, stdev } from "../../bench/lib/paired.js";

const ranks = (n: number) => Array.from({ length: n }, (_, i) => n - i); // n..1: the sort is exercised

describe("paired statistics", () => {
  it("medians, means and sample standard deviations", () => {
    assert.equal(median([3, 1, 2]), 2);
    assert.equal(median([4, 1, 3, 2]), 2.5);
    assert.ok(Number.isNaN(median([])));
    assert.equal(mean([1, 2, 3, 6]), 3);
    assert.equal(stdev([2, 4, 4, 4, 5, 5, 7, 9]), Math.sqrt(32 / 7));
    assert.ok(Number.isNaN(stdev([1])));
  });

  it("the sign-test interval of the median: the widest k whose exact coverage is still >= the level", () => {
    // n = 40: P(B <= 13) = 0.01924 for B ~ Bin(40, 1/2), so [x_(14), x_(27)] covers 96.15 %; k = 15 would be 91.93 %.
    const forty = medianInterval(ranks(40));
    assert.deepEqual({ low: forty?.low, high: forty?.high }, { low: 14, high: 27 });
    assert.ok(Math.abs((forty?.coverage ?? 0) - 0.96152) < 1e-4, `${forty?.coverage}`);
    // n = 20: [x_(6), x_(15)], 95.86 %.
    const twenty = medianInterval(ranks(20));
    assert.deepEqual({ low: twenty?.low, high: twenty?.high }, { low: 6, high: 15 });
    assert.ok(Math.abs((twenty?.coverage ?? 0) - 0.95861) < 1e-4, `${twenty?.coverage}`);
    // n = 5: even [x_(1), x_(5)] covers only 93.75 %: no 95 % interval.
    assert.equal(medianInterval(ranks(5)), undefined);
    assert.deepEqual(medianInterval(ranks(5), 0.9), { low: 1, high: 5, coverage: 0.9375 });
  });

  it("counts signs, leaving ties out", () => {
    assert.deepEqual(signs([-3, 0, 2, 5, -1, 0]), { above: 2, below: 2 });
  });
});
