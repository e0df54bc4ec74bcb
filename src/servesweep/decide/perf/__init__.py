"""Predict each configuration's performance before launching it.

A launch is the cost of a sweep (minutes of loading on many GPUs); the benchmarks of a
measured configuration are cheap next to it. So before a configuration is launched its
metrics (the objective's and the constraints') are predicted from what was measured,
and a configuration whose predicted interval cannot beat the best so far is not worth
a launch. The prediction is only as good as the evidence, so every answer is a value
with an interval, or ``unknown`` where the measurements do not reach.

Three kinds of knowledge, tried in this order for each configuration and metric:

1. *What a knob cannot change* (:attr:`Setting.invariant`): a metric measured on a
   configuration that differs only in parameters known not to affect it is that
   metric (acceptance of speculative decoding does not depend on the batch or the
   memory settings). A configuration measured itself answers with its measurement.
2. *The structure of speculative decoding* (:mod:`.speculative`): acceptance per draft
   position, from the engines' per-position counters or fitted from acceptance length
   per draft length, gives the expected accepted length of every draft length (one
   curve per drafter: trials that differ in a drafter's param, :attr:`Setting.drafter`,
   such as its minimum probability or ngram lookup, do not share one); the step cost
   against drafted and verified tokens and the batch is fitted from the levels of the
   configurations that share every other knob (a trial without speculation shares
   them whatever drafter params it lacks: they do nothing there); throughput is
   accepted tokens per step over the step time. Where the levels give their time to
   the first token, time per output token and tokens per answer, a request is its
   first token's time (the prompt's prefill, the draft's too: fitted apart, by the
   same shapes) and then its steps, the step time TPOT x acceptance length:
   ``c * n / (TTFT + (n - 1) * T / E[L])``; a step time read from throughput would
   count the prefill as decoding. The step cost's interval holds every non-negative
   fit (with a cost of a step without a draft) that agrees with the measurements
   within their noise: from no draft and one draft length a draft's cost may all be
   switching speculation on or all per drafted token, and the interval holds both.
3. *An empirical model over every knob* (:mod:`.empirical`): additive in the log of the
   metric, a Bayesian linear regression whose prior keeps each knob's effect within a
   factor of ``e**(+-1)`` over its range; two standard deviations are the interval, and
   a configuration whose interval would be wider than ``e**(+-0.5)`` is unknown.

Otherwise: unknown. Earlier sweeps' trials (the same engine, model and GPUs) join the
evidence as if measured in this sweep: a warm start.

Every interval holds what launches of one configuration vary: the relative noise of a
launch's figure, learned per metric from this sweep's relaunches by the rule ``best``
decides with (``decide.uncertainty.learned_launch_sd``, the sweep file's
``decision.launch_sd`` its prior); a measured configuration's interval is at least its
levels' own (:mod:`.predict`).

A model that is wrong about a launched configuration (the measurement outside its
interval) is trusted less for the rest of the sweep: :func:`verify` widens that
metric's intervals by what the miss needed, and never narrows them (:class:`Trust`).

Pure functions over plain records; no I/O.
"""

from servesweep.decide.perf.predict import predict, verify
from servesweep.decide.perf.records import Measured, Prediction, Setting, Trust

__all__ = ["Measured", "Prediction", "Setting", "Trust", "predict", "verify"]
