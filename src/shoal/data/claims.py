"""Synthetic Medicare Part B claims: a stand-in for the provider fraud data of the parallel SGD study.

Kennedy, Khoshgoftaar et al. train on CMS's Medicare Part B data: one row per provider, procedure
(HCPCS code) and place of service, labelled 1 where the provider is on the excluded-providers list,
about 1,400 positives in 3.3 million rows. That data is large and its labels need a join, so
`synth_claims` writes rows of the same make-up and rarity, any number of them, from a seed.

Each row has 29 raw attributes, 15 about the provider and 14 about the procedure and its payments
(`ATTRIBUTES`). Categorical ones are one-hot encoded; counts and amounts, which span orders of
magnitude, are log1p'd and then standardized, other numbers only standardized, with centres and
scales fixed by the task so that a train and a test set share them. The provider id (npi) is not
written: an id lets a model memorize providers instead of learning what fraud looks like. meta.json
records the attributes ("attributes", with each numeric one's transform, centre and scale), the
categories of each categorical one ("encoding", in the form imports use) and the name of every
feature column ("feature_names", e.g. "state=CA", "average_submitted_charge").

Labels follow interactions, as fraud does. Upcoding: a provider whose specialty resembles excluded
providers' charges well above the procedure's usual price. Volume: any provider bills many more
services per beneficiary than the procedure takes, at prices no higher than usual. Smaller additive
effects (specialty, state, non-participation, ...) join them in a row's log odds, which level off at
`RISK_CAP`; positives are drawn with probability proportional to the odds, so no row is sure to be
one. A linear model learns part of this (held-out ROC AUC about 0.8 on a balanced sample), a network
given enough positives more, none all: the generating odds themselves score about 0.92.

Each chunk of `CHUNK_ROWS` rows holds floor or ceil of rate x rows positives (the higher with
probability the fraction), chosen by weighted sampling without replacement (Gumbel top-k keys), so
the count is fixed by the seed and within a few of the target. The task (category weights, procedure
prices, which specialties are suspect) comes from `task_seed` alone, the rows from `seed`, as in
`shoal.data.synthetic`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from shoal.data.format import Dataset, DatasetWriter, open_dataset
from shoal.data.synthetic import _check_arguments, _chunks, _drawn_ahead, _source_meta
from shoal.errors import DataError

CHUNK_ROWS = 50_000  # 149 float32 features: 30 MB a chunk
POSITIVES_PER_MILLION = 1_400 / 3.3  # the study's rate: about 1,400 positives in 3.3 million rows
CALIBRATION_ROWS = 50_000  # rows the task draws to fix the centres and scales of numeric features
_CLAIMS_TASK_KEY = 3  # task streams are children of task_seed; synthetic.py uses keys 1 and 2

STATES = (
    "AK", "AL", "AR", "AZ", "CA", "CO", "CT", "DC", "DE", "FL", "GA", "HI", "IA", "ID", "IL", "IN", "KS",
    "KY", "LA", "MA", "MD", "ME", "MI", "MN", "MO", "MS", "MT", "NC", "ND", "NE", "NH", "NJ", "NM", "NV",
    "NY", "OH", "OK", "OR", "PA", "RI", "SC", "SD", "TN", "TX", "UT", "VA", "VT", "WA", "WI", "WV", "WY",
)
SPECIALTIES = (
    "Internal Medicine", "Family Practice", "Cardiology", "Diagnostic Radiology", "Ophthalmology",
    "Orthopedic Surgery", "Dermatology", "Physical Therapist", "Chiropractic", "Nurse Practitioner",
    "Physician Assistant", "Clinical Laboratory", "Ambulance Service Supplier", "Podiatry", "Psychiatry",
    "Anesthesiology", "General Surgery", "Emergency Medicine", "Urology", "Gastroenterology",
    "Pulmonary Disease", "Neurology", "Hematology-Oncology", "Optometry",
)
PROCEDURES = (
    "99203", "99204", "99211", "99212", "99213", "99214", "99215", "99232", "99233", "99284", "99285",
    "G0438", "G0439", "36415", "80053", "85025", "81001", "93000", "93306", "71046", "77067", "74177",
    "70553", "97110", "97112", "97140", "98941", "92014", "92250", "11721", "17000", "20610", "A0425",
    "A0427", "E1390", "J0897", "J1100", "J1885", "J2001", "J3301",
)  # HCPCS codes: J codes are drugs


@dataclass(frozen=True)
class Attribute:
    """One raw attribute: what it is about, and how it becomes feature columns."""

    name: str
    about: str  # "provider" or "procedure"
    kind: str  # "identifier" (not written), "categorical" (one-hot) or "numeric" (one float32 column)
    categories: tuple[str, ...] = ()
    log: bool = False  # numeric: log1p before standardizing (counts and amounts)


def _provider(name: str, kind: str, categories: tuple[str, ...] = (), log: bool = False) -> Attribute:
    return Attribute(name, "provider", kind, categories, log)


def _procedure(name: str, kind: str, categories: tuple[str, ...] = (), log: bool = False) -> Attribute:
    return Attribute(name, "procedure", kind, categories, log)


ATTRIBUTES = (
    _provider("npi", "identifier"),
    _provider("gender", "categorical", ("F", "M", "U")),  # U: organizations
    _provider("entity_type", "categorical", ("individual", "organization")),
    _provider("state", "categorical", STATES),
    _provider("specialty", "categorical", SPECIALTIES),
    _provider("medicare_participation", "categorical", ("Y", "N")),
    _provider("area", "categorical", ("metropolitan", "micropolitan", "small_town", "rural")),
    _provider("years_in_practice", "numeric"),
    _provider("provider_beneficiaries", "numeric", log=True),
    _provider("provider_services", "numeric", log=True),
    _provider("provider_procedures", "numeric", log=True),
    _provider("beneficiary_average_age", "numeric"),
    _provider("beneficiary_average_risk_score", "numeric"),
    _provider("beneficiary_dual_share", "numeric"),
    _provider("beneficiary_female_share", "numeric"),
    _procedure("place_of_service", "categorical", ("facility", "office")),
    _procedure("procedure_code", "categorical", PROCEDURES),
    _procedure("drug_indicator", "categorical", ("N", "Y")),
    _procedure("line_service_count", "numeric", log=True),
    _procedure("beneficiary_unique_count", "numeric", log=True),
    _procedure("beneficiary_day_service_count", "numeric", log=True),
    _procedure("services_per_beneficiary", "numeric", log=True),
    _procedure("average_submitted_charge", "numeric", log=True),
    _procedure("average_allowed_amount", "numeric", log=True),
    _procedure("average_payment", "numeric", log=True),
    _procedure("average_standardized_payment", "numeric", log=True),
    _procedure("submitted_charge_spread", "numeric", log=True),  # standard deviations within the row's claims
    _procedure("allowed_amount_spread", "numeric", log=True),
    _procedure("payment_spread", "numeric", log=True),
)
FEATURES = tuple(a for a in ATTRIBUTES if a.kind != "identifier")
FEATURE_NAMES = tuple(
    name for a in FEATURES for name in ([f"{a.name}={c}" for c in a.categories] if a.categories else [a.name])
)
# In the form CSV and Parquet imports record (shoal.data.encoding): the label, the feature columns in
# order, the categories of the categorical ones in the order of their one-hot features.
ENCODING = {
    "label": "excluded",
    "columns": [a.name for a in FEATURES],
    "categories": {a.name: list(a.categories) for a in FEATURES if a.categories},
}

# Spreads of the row-level noise: the risk measures charges and services against them.
CHARGE_NOISE = 0.35
SERVICE_NOISE = 0.35
AREA_WEIGHTS = np.array([0.75, 0.12, 0.08, 0.05])  # of the providers' areas, by the area attribute's order
SUSPECT_SPECIALTIES = 5  # specialties that resemble excluded providers'
UPCODING_WEIGHT = 5.0  # suspect specialty x charges above the procedure's usual
VOLUME_WEIGHT = 3.0  # services per beneficiary above the procedure's usual x charges not above it
# The risk levels off at RISK_CAP, so no row is more than a few tens of times as likely to be positive as
# the average row: positives stay a draw, the same at any rate up to a few percent, not the most extreme rows.
RISK_CAP = 6.0


def synth_claims(
    out: str,
    rows: int,
    *,
    seed: int = 0,
    task_seed: int = 0,
    positives_per_million: float = POSITIVES_PER_MILLION,
    overwrite: bool = False,
) -> Dataset:
    """Medicare Part B-like provider and procedure rows, float32 features, labels 1 for rare fraud-like rows."""
    _check_arguments(out, rows, seed, task_seed)
    rate = positives_per_million
    if isinstance(rate, bool) or not isinstance(rate, (int, float, np.integer, np.floating)) or not 0 < rate < 1e6:
        raise DataError(f"{out}: positives_per_million must be a number above 0 and below 1000000, got {rate!r}")
    task = _claims_task(task_seed)
    meta = _source_meta("claims", rows, seed, task_seed, positives_per_million=float(rate))
    meta |= {"attributes": task.describe(), "encoding": ENCODING}
    # Classes fixed at [0, 1]: a set too small to hold a positive still poses the two-class task.
    options = {"feature_names": list(FEATURE_NAMES), "classes": [0, 1], "overwrite": overwrite}
    positives = 0
    with DatasetWriter(out, (len(FEATURE_NAMES),), np.float32, extra_meta=meta, **options) as writer:
        draw = functools.partial(_draw_claims, task=task, rate=float(rate) / 1e6)
        for features, labels in _drawn_ahead(draw, seed, _chunks(rows, CHUNK_ROWS), CHUNK_ROWS):
            writer.write(features, labels)
            positives += int(labels.sum())
        writer.extra_meta["source"]["positives"] = positives
    return open_dataset(out)


def _draw_claims(
    generator: np.random.Generator, count: int, *, task: _ClaimsTask, rate: float
) -> tuple[np.ndarray, np.ndarray]:
    raw = task.draw(generator, count)
    wanted = rate * count
    positives = min(count, math.floor(wanted) + int(generator.random() < wanted - math.floor(wanted)))
    # Gumbel top-k: k rows drawn without replacement with probability proportional to exp(risk).
    keys = task.risk(raw) + generator.gumbel(size=count)
    labels = np.zeros(count, dtype=np.int64)
    if positives:
        labels[np.argpartition(-keys, positives - 1)[:positives]] = 1
    return task.encode(raw), labels


@functools.lru_cache(maxsize=4)
def _claims_task(task_seed: int) -> _ClaimsTask:
    """Built once per task: a train and a test set made in one process share the calibration."""
    return _ClaimsTask(task_seed)


def _ramp(x: np.ndarray) -> np.ndarray:
    """A smooth max(x, 0): a softplus twice as sharp."""
    return np.logaddexp(0.0, 2.0 * x) / 2.0


def _choose(generator: np.random.Generator, weights: np.ndarray, count: int) -> np.ndarray:
    """`count` category indices drawn with the given weights."""
    cumulative = np.cumsum(weights)
    return np.minimum(np.searchsorted(cumulative, generator.random(count) * cumulative[-1], side="right"),
                      len(weights) - 1)


def _choose_per_row(generator: np.random.Generator, cumulative: np.ndarray) -> np.ndarray:
    """One category index per row of `cumulative` (rows, categories): each row its own distribution."""
    u = generator.random((len(cumulative), 1)) * cumulative[:, -1:]
    return np.minimum((cumulative <= u).sum(axis=1), cumulative.shape[1] - 1)


class _ClaimsTask:
    """What `task_seed` fixes: category weights, procedure prices, specialty risks, feature scales."""

    def __init__(self, task_seed: int):
        generator = np.random.default_rng(np.random.SeedSequence(task_seed, spawn_key=(_CLAIMS_TASK_KEY,)))
        states, specialties, procedures = len(STATES), len(SPECIALTIES), len(PROCEDURES)
        self.state_weights = _normalized(generator.gamma(2.0, size=states))
        self.state_price = np.exp(0.08 * generator.standard_normal(states))  # geographic cost index
        self.state_risk = 0.25 * generator.standard_normal(states)
        self.specialty_weights = _normalized(generator.gamma(1.5, size=specialties))
        self.organization_share = generator.beta(0.5, 6.0, size=specialties)
        self.specialty_size = 0.4 * generator.standard_normal(specialties)  # log beneficiaries
        self.markup = 0.15 * generator.standard_normal(specialties)  # log of charge over the procedure's usual
        self.suspect = np.zeros(specialties)
        self.suspect[generator.choice(specialties, SUSPECT_SPECIALTIES, replace=False)] = 1.0
        self.specialty_risk = 0.5 * generator.standard_normal(specialties) + 0.6 * self.suspect
        # Each specialty bills a few procedures often and most rarely.
        mix = generator.dirichlet(np.full(procedures, 0.3), size=specialties)
        self.procedure_cumulative = np.cumsum(mix, axis=1)
        self.drug = np.array([code.startswith("J") for code in PROCEDURES])
        self.log_charge = generator.uniform(np.log(20.0), np.log(1_500.0), size=procedures)
        self.allowed_share = generator.uniform(0.25, 0.6, size=procedures)
        self.facility_share = generator.beta(1.0, 3.0, size=procedures)
        self.log_services = np.where(self.drug, generator.uniform(1.0, 4.0, procedures),
                                     generator.uniform(0.0, 1.2, procedures))  # services per beneficiary
        self.center = np.zeros(len(FEATURES))
        self.scale = np.ones(len(FEATURES))
        numeric = self._numeric(self.draw(generator, CALIBRATION_ROWS))
        for index, column in numeric.items():
            # Rounded, so meta.json shows short numbers and they are the ones the features use.
            self.center[index] = float(f"{column.mean():.6g}")
            self.scale[index] = float(f"{column.std():.6g}")

    def draw(self, generator: np.random.Generator, count: int) -> dict[str, np.ndarray]:
        """Raw attributes of `count` rows: category indices and numbers in their natural units."""
        normal = functools.partial(generator.standard_normal, count)
        specialty = _choose(generator, self.specialty_weights, count)
        organization = generator.random(count) < self.organization_share[specialty]
        male = generator.random(count) < 0.58
        gender = np.where(organization, 2, np.where(male, 1, 0))
        state = _choose(generator, self.state_weights, count)
        participation = (generator.random(count) < 0.03).astype(np.int16)  # 1: not participating
        area = _choose(generator, AREA_WEIGHTS, count)
        years = np.where(organization, generator.gamma(2.0, 7.0, count), generator.gamma(3.0, 6.0, count))
        years = np.clip(np.round(years), 1, 50)
        beneficiaries = np.round(np.exp(np.log(300.0) + self.specialty_size[specialty] + 0.9 * normal()))
        beneficiaries = np.maximum(11, beneficiaries)  # CMS leaves out providers with fewer than 11
        services = np.round(beneficiaries * np.exp(np.log(4.0) + 0.6 * normal()))
        procedures = np.maximum(1, np.round(np.exp(np.log(25.0) + 0.7 * normal())))
        age = np.clip(72.0 + 3.0 * normal(), 65.0, 90.0)
        risk_score = np.exp(np.log(1.4) + 0.3 * normal())
        dual = generator.beta(2.0, 8.0, count)
        female = generator.beta(11.0, 9.0, count)

        code = _choose_per_row(generator, self.procedure_cumulative[specialty])
        facility = generator.random(count) < self.facility_share[code]
        unique = np.minimum(beneficiaries, 11 + np.floor(np.exp(np.log(20.0) + normal())))
        per_beneficiary = np.maximum(1.0, np.exp(self.log_services[code] + SERVICE_NOISE * normal()))
        lines = np.maximum(unique, np.round(unique * per_beneficiary))
        days = unique + np.round((lines - unique) * generator.uniform(0.5, 1.0, count))
        services = np.maximum(services, lines)  # the provider's total includes this row's
        usual_charge = self.log_charge[code] + self.markup[specialty]
        charge = np.exp(usual_charge + CHARGE_NOISE * normal())
        price = self.state_price[state]
        allowed = np.exp(self.log_charge[code] + 0.06 * normal()) * self.allowed_share[code] * price
        allowed = np.minimum(np.where(facility, 0.8 * allowed, allowed), charge)
        payment = allowed * generator.uniform(0.77, 0.8, count)  # 80% less sequestration
        # Many rows bill one price (spread 0); the rest spread by a few to tens of percent.
        charge_spread = np.where(generator.random(count) < 0.45, 0.0, charge * np.exp(np.log(0.15) + 0.6 * normal()))
        allowed_spread = np.where(generator.random(count) < 0.3, 0.0, allowed * np.exp(np.log(0.05) + 0.7 * normal()))
        return {
            "gender": gender, "entity_type": organization, "state": state, "specialty": specialty,
            "medicare_participation": participation, "area": area, "years_in_practice": years,
            "provider_beneficiaries": beneficiaries, "provider_services": services,
            "provider_procedures": procedures, "beneficiary_average_age": age,
            "beneficiary_average_risk_score": risk_score, "beneficiary_dual_share": dual,
            "beneficiary_female_share": female, "place_of_service": np.where(facility, 0, 1),
            "procedure_code": code, "drug_indicator": self.drug[code], "line_service_count": lines,
            "beneficiary_unique_count": unique, "beneficiary_day_service_count": days,
            "services_per_beneficiary": lines / unique, "average_submitted_charge": charge,
            "average_allowed_amount": allowed, "average_payment": payment,
            "average_standardized_payment": payment / price, "submitted_charge_spread": charge_spread,
            "allowed_amount_spread": allowed_spread, "payment_spread": 0.8 * allowed_spread * np.exp(0.1 * normal()),
        }

    def risk(self, raw: dict[str, np.ndarray]) -> np.ndarray:
        """Log of a row's relative odds of being positive: while positives are rare, P(1) is proportional to e**risk."""
        specialty, code = raw["specialty"], raw["procedure_code"]
        usual_charge = self.log_charge[code] + self.markup[specialty]
        charge_excess = (np.log(raw["average_submitted_charge"]) - usual_charge) / CHARGE_NOISE
        service_excess = (np.log(raw["services_per_beneficiary"]) - self.log_services[code]) / SERVICE_NOISE
        additive = (
            self.specialty_risk[specialty]
            + self.state_risk[raw["state"]]
            + 0.8 * raw["medicare_participation"]
            + 0.2 * (raw["gender"] == 1)
            + 1.5 * (raw["beneficiary_dual_share"] - 0.2)
        )
        # Two products a linear model cannot form, and in which high charges pull opposite ways.
        upcoding = self.suspect[specialty] * _ramp(charge_excess - 0.5)
        volume = _ramp(service_excess - 0.5) * _ramp(-charge_excess)
        risk = additive + UPCODING_WEIGHT * upcoding + VOLUME_WEIGHT * volume
        return RISK_CAP - np.logaddexp(0.0, RISK_CAP - risk)  # a smooth min(risk, RISK_CAP)

    def encode(self, raw: dict[str, np.ndarray]) -> np.ndarray:
        """The float32 feature matrix: one-hot blocks and standardized numbers, in `FEATURE_NAMES` order."""
        count = len(raw["specialty"])
        features = np.zeros((count, len(FEATURE_NAMES)), dtype=np.float32)
        numeric = self._numeric(raw)
        column = 0
        for index, attribute in enumerate(FEATURES):
            if attribute.categories:
                features[np.arange(count), column + raw[attribute.name].astype(np.intp)] = 1.0
                column += len(attribute.categories)
            else:
                features[:, column] = (numeric[index] - self.center[index]) / self.scale[index]
                column += 1
        return features

    def _numeric(self, raw: dict[str, np.ndarray]) -> dict[int, np.ndarray]:
        """Numeric attributes by position in `FEATURES`, log1p'd where they are counts or amounts."""
        return {
            index: np.log1p(raw[a.name]) if a.log else raw[a.name].astype(np.float64)
            for index, a in enumerate(FEATURES)
            if a.kind == "numeric"
        }

    def describe(self) -> list[dict[str, Any]]:
        """The raw attributes for meta.json: a numeric feature is (log1p(value) or value - center) / scale."""
        described = []
        for attribute in ATTRIBUTES:
            entry: dict[str, Any] = {"name": attribute.name, "about": attribute.about, "kind": attribute.kind}
            if attribute.kind == "identifier":
                entry["written"] = False  # an id would let a model memorize providers
            elif attribute.kind == "numeric":
                index = FEATURES.index(attribute)
                entry |= {"log1p": attribute.log, "center": self.center[index], "scale": self.scale[index]}
            described.append(entry)
        return described


def _normalized(weights: np.ndarray) -> np.ndarray:
    return weights / weights.sum()
