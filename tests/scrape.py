"""Scraping a metrics endpoint the way Prometheus does: an HTTP GET, the text parsed."""

from __future__ import annotations

import urllib.request

import attrs
import trio
from prometheus_client.parser import text_string_to_metric_families


@attrs.frozen
class Scrape:
    """One scrape: every sample, by name and labels.

    Attributes:
        text: the body as served.
        samples: ``(sample name, frozenset of (label, value)) -> value``.
    """

    text: str
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]

    @property
    def names(self) -> set[str]:
        """The names of the samples (``x_total``, ``y_bucket``, ...)."""
        return {name for name, _ in self.samples}

    def values(self, name: str, **labels: str) -> dict[frozenset[tuple[str, str]], float]:
        """The samples named ``name`` whose labels include ``labels``."""
        wanted = set(labels.items())
        return {
            sample_labels: value
            for (sample_name, sample_labels), value in self.samples.items()
            if sample_name == name and wanted <= sample_labels
        }

    def total(self, name: str, **labels: str) -> float:
        """The sum of the samples named ``name`` whose labels include ``labels``."""
        return sum(self.values(name, **labels).values())

    def by_partition(self, name: str, **labels: str) -> dict[int, float]:
        """The samples named ``name`` (with ``labels``), by their partition label."""
        return {
            int(dict(sample_labels)["partition"]): value
            for sample_labels, value in self.values(name, **labels).items()
        }


def parse(text: str) -> Scrape:
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name, frozenset(sample.labels.items())] = sample.value
    return Scrape(text, samples)


async def scrape(url: str) -> Scrape:
    """GET ``url`` (in a thread: urllib blocks) and parse the exposition."""

    def get() -> str:
        with urllib.request.urlopen(url, timeout=10) as response:
            body: bytes = response.read()
        return body.decode()

    return parse(await trio.to_thread.run_sync(get))
