"""Custom metrics (pb_utils.MetricFamily) driven by ACTION:

- count: increments a counter by VALUE; gauge: sets a gauge to VALUE; observe: VALUE into a
  histogram (buckets 0.1, 1, 2.5). Each reports the metric's value (the histogram: null).
- refusals: what each operation a kind does not allow raises (a list of messages).
- lifetime: the message a metric gives once its family object is gone.
- not_a_number: what increment(None) raises (it hung the model once).
- redefined: a metric dropped and made again with the same labels, incremented by 2, then 1:
  its value (the same metric).
- odd_names: a gauge whose family name ends in `_created` set to VALUE, and a metric labelled
  with a lone surrogate."""

import gc
import json

import numpy as np
import triton_python_backend_utils as pb_utils

LABELS = {"source": "custom_metrics_model"}


class TritonPythonModel:
    def initialize(self, args):
        family = pb_utils.MetricFamily
        self.counter_family = family("test_model_requests", "requests counted", family.COUNTER)
        self.gauge_family = family("test_model_level", "a level", family.GAUGE)
        self.histogram_family = family("test_model_sizes", "sizes seen", family.HISTOGRAM)
        self.requests = self.counter_family.Metric(labels=LABELS)
        self.level = self.gauge_family.Metric(labels=LABELS)
        self.sizes = self.histogram_family.Metric(labels=LABELS, buckets=[0.1, 1.0, 2.5])

    def execute(self, requests):
        responses = []
        for request in requests:
            action = pb_utils.get_input_tensor_by_name(request, "ACTION").as_numpy()[0].decode()
            value = float(pb_utils.get_input_tensor_by_name(request, "VALUE").as_numpy()[0])
            report = getattr(self, action)(value)
            text = np.array([json.dumps(report).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", text)]))
        return responses

    def count(self, value):
        self.requests.increment(value)
        return self.requests.value()

    def gauge(self, value):
        self.level.set(value)
        return self.level.value()

    def observe(self, value):
        self.sizes.observe(value)
        return None

    def refusals(self, value):
        family = pb_utils.MetricFamily
        attempts = [
            lambda: self.requests.increment(-1.0),
            lambda: self.requests.set(1.0),
            lambda: self.level.observe(1.0),
            lambda: self.sizes.value(),
            lambda: self.histogram_family.Metric(labels={}),
            lambda: self.histogram_family.Metric(labels={}, buckets=[2.0, 1.0]),
            lambda: self.counter_family.Metric(labels={}, buckets=[1.0]),
            lambda: family("test_model_requests", "requests counted", family.GAUGE),
        ]
        messages = []
        for attempt in attempts:
            try:
                attempt()
                messages.append(None)
            except pb_utils.TritonModelException as exc:
                messages.append(str(exc))
        return messages

    def lifetime(self, value):
        family = pb_utils.MetricFamily(
            "test_model_short_lived", "gone soon", pb_utils.MetricFamily.GAUGE
        )
        metric = family.Metric(labels={})
        del family
        try:
            metric.set(1.0)
        except pb_utils.TritonModelException as exc:
            return str(exc)
        return None

    def not_a_number(self, value):
        self.level.set(np.array([2.5]))  # a number, as Triton's bindings read it
        try:
            self.requests.increment(None)
        except TypeError as exc:
            return [f"TypeError: {exc}", self.level.value()]
        return None

    def redefined(self, value):
        self.counter_family.Metric(labels={"route": "a"}).increment(2.0)
        gc.collect()  # the first object is gone before the second is made
        metric = self.counter_family.Metric(labels={"route": "a"})
        metric.increment(1.0)
        return metric.value()

    def odd_names(self, value):
        family = pb_utils.MetricFamily
        self.jobs_family = family("test_model_jobs_created", "jobs", family.GAUGE)
        self.jobs = self.jobs_family.Metric(labels=LABELS)
        self.jobs.set(value)
        self.odd = self.gauge_family.Metric(labels={"odd": "x\udc80"})
        self.odd.set(1.0)
        return self.jobs.value()
