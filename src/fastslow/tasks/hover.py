"""HoVer-style multi-hop claim verification, generated offline from a fictional world.

Each problem draws a small consistent world (people, towns, regions, organisations, works and
years, linked by functional relations), writes one short evidence document per entity, and
states a claim along a chain of 2–4 relations ("The birthplace of the founder of Kestrel
Records lies in the Arvale region."). Some relations have a sibling of the same types (born in /
lives in, founded by / led by, mayor / deputy mayor, created by / dedicated to); a claim has one
or two hops whose relation has one. The documents show a path along every variant of the
claim's relations (each such hop as claimed or swapped for its sibling) from the claim's entity
and from a *twin* start of its kind ("... of the founder of Lumen Press"): from the claim's
entity an even number of swaps ends on the true value and an odd number on the false one, from
the twin the reverse, and no two paths meet (see `_square`). So each value is reached as often
from either start, and only the claim's entity and every one of its sibling-bearing relations
together decide the label (the other hops are settled by their types). A NOT_SUPPORTED claim names the false value. Labels are balanced; the documents of
either label are drawn alike, with a few random distractors beside the paths.

`hover_hard` (difficulty "hard"): 3–4 hops, more distractor documents, and for a year-valued
claim the false year is the one-swap path's nearest the truth.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any

from fastslow.tasks.base import ANSWER_FORMAT, Judgement, Problem, extract_answer
from fastslow.tasks.generated import Candidate, GeneratedTask, stable_int
from fastslow.tasks.scoring import normalize_label

LABELS = ("SUPPORTED", "NOT_SUPPORTED")

_FIRST = ("Mira Ivo Talia Oren Selka Bram Yuna Caspar Liesl Dario Maren Tobin Anouk Rafe Ilse Joren "
          "Kaia Lucan Nerys Otto Petra Quill Rosalind Soren Thea Ulric Vesna Wren Ysolde Zev Alba "
          "Corin Edda Fenn Greta Hale Isolde Jasper Katell Linnea").split()
_SUR_A = "Ash Bel Cor Dray El Fal Gar Hol Ivers Kel Lor Mar Nor Ost Pell Quen Ros Stav Tor Vell Wyn".split()
_SUR_B = "by croft den ford holm ley mont ridge sen stone vik wick wood".split()
_TOWN_A = "Dun Har Kil Mor Bryn Cal Eld Fen Glen Lan Nether Pen Rath Sel Tarn Wex Yar Brae Cor Ulm".split()
_TOWN_B = "mere gate moor haven ford wick stead port dale holt bridge fell".split()
_REGIONS = ("Arvale Brennmark Caldoria Drossland Estmere Falkreach Gorvale Helmara Isken Jarrow "
            "Kelvary Lorne Marrowind Norhaven Orlesk Pellinor").split()
_ORG_WORDS = ("Kestrel Lumen Obsidian Harbor Juniper Copperleaf Silverline Northwind Bluefern Ironbark "
              "Amberly Meridian Saltmarsh Larkspur Thornfield Greywater Redcliff Starling").split()
_WORK_ADJ = "Glass Silent Hollow Crimson Last Paper Winter Sunken Iron Velvet Distant Burning".split()
_WORK_NOUN = "Orchard Lantern Harbor Atlas Choir Garden Ledger Tide Signal Archive Compass Meadow".split()
# Name pools, built once: worlds sample from them without replacement.
_SURNAMES = tuple(a + b for a in _SUR_A for b in _SUR_B)
_PERSON_NAMES = tuple(f"{f} {s}" for f in _FIRST for s in _SURNAMES)
# not a surname too ("The mayor of Corford is Tobin Corford" named the town twice)
_TOWN_NAMES = tuple(a + b for a in _TOWN_A for b in _TOWN_B if a + b not in _SURNAMES)
_WORK_TITLES = tuple(f"The {a} {b}" for a in _WORK_ADJ for b in _WORK_NOUN)
# Organisation kinds: their names' suffix.
_ORG_KINDS = {"university": "University", "press": "Press", "label": "Records", "studio": "Studios"}
# Work kinds: (creator verb, creator noun phrase, publisher kind, publisher verb, publisher noun
# phrase, year verb).
_WORK_KINDS = {
    "novel": ("written by", "the author of", "press", "published by", "the publisher of", "published in"),
    "album": ("recorded by", "the artist who recorded", "label", "released by", "the label that released",
              "released in"),
    "film": ("directed by", "the director of", "studio", "produced by", "the studio that produced", "released in"),
}


@dataclass(eq=False)  # identity semantics: entities are unique objects of one world
class Entity:
    name: str
    type: str  # person | place | region | org | work | year
    kind: str = ""  # org kind or work kind


def _title(e: Entity) -> str:
    return f'"{e.name}"' if e.type == "work" else e.name


class World:
    """A small consistent world: every relation is a total function on its subject type."""

    def __init__(self, rng: random.Random, size: int) -> None:
        self.rel: dict[tuple[str, str], Entity] = {}  # (subject name, relation) -> object
        names = rng.sample(_PERSON_NAMES, 12 + size)
        self.people = [Entity(n, "person") for n in names]
        self.towns = [Entity(n, "place") for n in rng.sample(_TOWN_NAMES, 2 + size)]
        self.regions = [Entity(n, "region") for n in rng.sample(_REGIONS, 3 + size // 3)]
        kinds = ["university", "university", "press", "label", "studio", rng.choice(["university", "press"]),
                 "label", "studio"] + [rng.choice(list(_ORG_KINDS)) for _ in range(min(size // 2, len(_ORG_WORDS) - 8))]
        self.orgs = [Entity(f"{w} {_ORG_KINDS[k]}", "org", kind=k)
                     for w, k in zip(rng.sample(_ORG_WORDS, len(kinds)), kinds, strict=True)]
        titles = rng.sample(_WORK_TITLES, 2 + size // 2)
        self.works = [Entity(t, "work", kind=rng.choice(list(_WORK_KINDS))) for t in titles]
        years: dict[str, int] = {}
        for p in self.people:
            years[p.name] = rng.randint(1890, 1985)
            self._set(p, "born_in", rng.choice(self.towns))
            self._set(p, "birth_year", Entity(str(years[p.name]), "year"))
            self._set(p, "studied_at", rng.choice([o for o in self.orgs if o.kind == "university"]))
            self._set(p, "lives_in", rng.choice(self.towns))
        # drawn with replacement, as every other person-valued fact: one person may be mayor of two
        # towns, or found two organisations (distinct leaders told a fact `_square` had set apart)
        leaders = [rng.choice(self.people) for _ in range(len(self.towns) + len(self.orgs))]
        for town, mayor in zip(self.towns, leaders, strict=False):  # leaders: mayors, then founders
            self._set(town, "region", rng.choice(self.regions))
            self._set(town, "mayor", mayor)
            self._set(town, "deputy_mayor", rng.choice(self.people))
        for org, founder in zip(self.orgs, leaders[len(self.towns):], strict=True):
            self._set(org, "founded_by", founder)
            self._set(org, "led_by", rng.choice(self.people))
            self._set(org, "based_in", rng.choice(self.towns))
            self._set(org, "founded_year", Entity(str(years[founder.name] + rng.randint(24, 60)), "year"))
        for work in self.works:
            creator = rng.choice(self.people)
            pub_kind = _WORK_KINDS[work.kind][2]
            self._set(work, "creator", creator)
            self._set(work, "dedicated_to", rng.choice(self.people))
            self._set(work, "publisher", rng.choice([o for o in self.orgs if o.kind == pub_kind]))
            self._set(work, "year", Entity(str(years[creator.name] + rng.randint(20, 55)), "year"))

    def _set(self, s: Entity, r: str, o: Entity) -> None:
        self.rel[(s.name, r)] = o

    def get(self, s: Entity, r: str) -> Entity:
        return self.rel[(s.name, r)]

    def entities(self, type_: str) -> list[Entity]:
        return {"person": self.people, "place": self.towns, "org": self.orgs, "work": self.works,
                "region": self.regions}.get(type_, [])

    def documented(self) -> list[Entity]:
        return self.people + self.towns + self.orgs + self.works


def _rel_text(s: Entity, r: str) -> tuple[str, str | None, str]:
    """(fact template, noun-phrase template or None, claim template) for relation r of s."""
    if s.type == "work":
        by, noun, _, pub, pub_noun, year = _WORK_KINDS[s.kind]
        article = "an" if s.kind[0] in "aeiou" else "a"
        return {"creator": (f"{{s}} is {article} {s.kind} {by} {{o}}.", f"{noun} {{s}}", f"{{s}} was {by} {{o}}."),
                "publisher": (f"{{s}} was {pub} {{o}}.", f"{pub_noun} {{s}}", f"{{s}} was {pub} {{o}}."),
                "dedicated_to": ("{s} is dedicated to {o}.", "the dedicatee of {s}", "{s} is dedicated to {o}."),
                "year": (f"{{s}} was {year} {{o}}.", None, f"{{s}} was {year} {{o}}.")}[r]
    return {
        "born_in": ("{s} was born in {o}.", "the birthplace of {s}", "{s} was born in {o}."),
        "birth_year": ("{s} was born in the year {o}.", None, "{s} was born in {o}."),
        "studied_at": ("{s} studied at {o}.", "the university attended by {s}", "{s} studied at {o}."),
        "lives_in": ("{s} lives in {o}.", "the town in which {s} lives", "{s} lives in {o}."),
        "region": ("{s} is a town in the {o} region.", None, "{s} lies in the {o} region."),
        "mayor": ("The mayor of {s} is {o}.", "the mayor of {s}", "{o} is the mayor of {s}."),
        "deputy_mayor": ("The deputy mayor of {s} is {o}.", "the deputy mayor of {s}", "{o} is the deputy mayor of {s}."),
        "founded_by": ("{s} was founded by {o}.", "the founder of {s}", "{s} was founded by {o}."),
        "led_by": ("{s} is led by {o}.", "the head of {s}", "{s} is led by {o}."),
        "based_in": ("{s} is based in {o}.", "the town in which {s} is based", "{s} is based in {o}."),
        "founded_year": ("{s} was founded in {o}.", None, "{s} was founded in {o}."),
    }[r]


_RELATIONS = {"person": ("born_in", "lives_in", "birth_year", "studied_at"), "place": ("region", "mayor", "deputy_mayor"),
              "org": ("founded_by", "led_by", "based_in", "founded_year"),
              "work": ("creator", "dedicated_to", "publisher", "year")}
# Sibling relations: of one subject type, to one object type. A claim's hop whose relation has one
# is shown swapped too (`_square`).
_SIBLINGS = {"born_in": "lives_in", "lives_in": "born_in", "founded_by": "led_by", "led_by": "founded_by",
             "creator": "dedicated_to", "dedicated_to": "creator", "mayor": "deputy_mayor",
             "deputy_mayor": "mayor"}
# Year relations and the span (years after the person's birth) the world draws them in.
_YEAR_SPANS = {"founded_year": ("founded_by", 24, 60), "year": ("creator", 20, 55)}
# A person-valued relation of an organisation or work -> its year relation and that span.
_BIRTH_SPANS = {r: (year_rel, lo, hi) for year_rel, (person_rel, lo, hi) in _YEAR_SPANS.items()
                for r in (person_rel, _SIBLINGS[person_rel])}


def _fact(s: Entity, r: str, o: Entity) -> str:
    return _rel_text(s, r)[0].format(s=_title(s), o=_title(o))


def _document(world: World, e: Entity) -> str:
    return " ".join(_fact(e, r, world.get(e, r)) for r in _RELATIONS[e.type])


class HoverTask(GeneratedTask):
    """Multi-hop claim verification over generated evidence documents."""

    family = "hover"
    demo_working = ("Deciding facts:", "So the documents give:")
    attempts_per_problem = 40

    def demo_gist(self, problem: Problem) -> str | None:
        """The claim (the documents are left out; the feedback's deciding facts quote them)."""
        claim = problem.metadata.get("claim")
        return f"Claim: {claim}" if isinstance(claim, str) and claim.strip() else None

    def candidate(self, rng: random.Random, index: int, split: str, seed: int,
                  attempt: int) -> Candidate | None:
        hard = self.difficulty == "hard"
        hops = {"easy": rng.choice([2]), "default": rng.choice([2, 2, 3, 3, 4]),
                "hard": rng.choice([3, 4, 4])}[self.difficulty]
        # Exactly balanced labels: each consecutive pair holds one of each, in a seeded order.
        flip = stable_int("hover-label", seed, split, index // 2) % 2
        label = LABELS[(index + flip) % 2]
        # New worlds for the drawn hops until one holds a square: a rejected candidate drew its
        # hops again, and long chains, whose paths meet more often, grew rare (8% of hover's 4 hops)
        for _ in range(40):
            world = World(rng, size={"easy": 5, "default": 20, "hard": 28}[self.difficulty])
            chain = _chain(world, rng, hops)
            if chain is None:
                continue
            ents, rels = chain
            truth = ents[-1]
            # Every variant of the claim's relations (its sibling-bearing hops as claimed or swapped)
            # from the claim's entity and from a twin start, shown whatever the label (`_square`).
            square = _square(world, rng, ents, rels, near=hard)
            if square is not None:
                break
        else:
            return None
        shown = list(square.docs)
        pool = [e for e in world.documented() if e not in shown]
        n_distract = {"easy": 1, "default": rng.randint(0, 2), "hard": rng.randint(1, 3)}[self.difficulty]
        shown += rng.sample(pool, min(n_distract, len(pool)))
        rng.shuffle(shown)
        docs = [(e.name, _document(world, e)) for e in shown]
        claimed = truth if label == "SUPPORTED" else square.near_miss[-1]
        claim = _claim(ents, rels, claimed)
        doc_no = {e.name: i + 1 for i, e in enumerate(shown)}
        facts = [{"doc": doc_no[s.name], "fact": _fact(s, r, o)}
                 for s, r, o in zip(ents[:-1], rels, ents[1:], strict=True)]
        prompt = (
            "Decide whether the claim is supported by the documents. The claim may combine facts from "
            "several documents: resolve it step by step. Answer SUPPORTED if the documents establish "
            "the claim, otherwise NOT_SUPPORTED.\n\nDocuments:\n"
            + "\n".join(f"[{i + 1}] {title}: {text}" for i, (title, text) in enumerate(docs))
            + f"\n\nClaim: {claim}\n\nAnswer with SUPPORTED or NOT_SUPPORTED. {ANSWER_FORMAT}")
        meta: dict[str, Any] = {
            "claim": claim, "hops": hops, "label": label, "chain": facts,
            "true_statement": _claim(ents, rels, truth), "true_value": truth.name, "claimed_value": claimed.name,
            "twin_start": square.twin[0].name, "n_docs": len(docs),
        }
        if label == "NOT_SUPPORTED":
            i, path = square.swap, square.near_miss
            meta["decoy_chain"] = [{"doc": doc_no[s.name], "fact": _fact(s, r, o)} for s, r, o in
                                   zip(path[:-1], _variant(rels, frozenset([i])), path[1:], strict=True)][i - 1:]
            meta["perturbation"] = (f"the claimed value is reached from {_title(ents[0])} with "
                                    f"'{_noun(ents[i - 1], _SIBLINGS[rels[i - 1]])}' at hop {i} in place of the claim's "
                                    f"'{_noun(ents[i - 1], rels[i - 1])}', and along the claim's relations from "
                                    f"{_title(square.twin[0])}")
        return Candidate(prompt=prompt, answer=label, metadata=meta)

    def judge(self, problem: Problem, completion: str) -> Judgement:
        # a gold label read as an answer is ("not supported" is NOT_SUPPORTED), else as written
        expected = normalize_label(problem.answer, LABELS) or problem.answer.strip().upper()
        raw = extract_answer(completion)
        got = normalize_label(raw, LABELS) if raw is not None else None
        m = problem.metadata
        notes = []
        if raw is not None and got is None:
            notes.append("The answer must be exactly SUPPORTED or NOT_SUPPORTED.")
        if m.get("chain"):
            notes.append("Deciding facts: " + " ".join(f"[{f['doc']}] {f['fact']}" for f in m["chain"]))
            verdict = "matches" if expected == "SUPPORTED" else "contradicts"
            notes.append(f"So the documents give: {m.get('true_statement')} The claim says "
                         f"{m.get('claimed_value')}, which {verdict} them.")
        if m.get("decoy_chain") and expected == "NOT_SUPPORTED":
            notes.append("Near miss: " + " ".join(f"[{f['doc']}] {f['fact']}" for f in m["decoy_chain"])
                         + f" — {m.get('perturbation')}.")
        return Judgement(float(got == expected), expected, raw if got is None else got, notes)


def _chain(world: World, rng: random.Random, hops: int) -> tuple[list[Entity], list[str]] | None:
    """A path e0 -r1-> e1 ... -rk-> ek without revisits; inner objects have documents."""
    for _ in range(30):
        ents = [rng.choice(world.documented())]
        rels: list[str] = []
        while len(rels) < hops:
            options = [r for r in _RELATIONS[ents[-1].type]
                       if len(rels) == hops - 1 or _rel_text(ents[-1], r)[1] is not None]
            r = rng.choice(options)
            nxt = world.get(ents[-1], r)
            if nxt in ents:
                break
            ents.append(nxt)
            rels.append(r)
        if len(rels) == hops:
            return ents, rels
    return None


@dataclass
class _Square:
    """The paths a problem shows, from the claim's entity e0 and from a twin start x0 of its kind:
    one along each variant of the claim's relations, a variant being the set of sibling-bearing
    hops whose relation it swaps for the sibling. From e0 a variant swapping an even number of
    hops ends on the truth (the claim's own relations, none swapped, among them), an odd number
    on the false value; from x0 the reverse. A path is its entities e0 .. ek."""

    paths: dict[frozenset[int], list[Entity]]
    twin_paths: dict[frozenset[int], list[Entity]]
    swap: int  # the hop whose one-swap variant from e0 is shown as the near miss
    docs: list[Entity]  # every path's documented entities (all but its end), each once

    @property
    def twin(self) -> list[Entity]:
        return self.twin_paths[frozenset()]

    @property
    def near_miss(self) -> list[Entity]:
        return self.paths[frozenset([self.swap])]


def _walk(world: World, start: Entity, rels: list[str]) -> list[Entity]:
    path = [start]
    for r in rels:
        path.append(world.get(path[-1], r))
    return path


def _variant(rels: list[str], swapped: frozenset[int]) -> list[str]:
    """`rels` with the relation of each hop in `swapped` (1 .. k) replaced by its sibling."""
    return [_SIBLINGS[r] if j in swapped else r for j, r in enumerate(rels, start=1)]


def _within(year: Entity, birth_year: Entity, lo: int, hi: int) -> bool:
    """Whether `year` falls `lo`-`hi` years after `birth_year` (a span `_YEAR_SPANS` names)."""
    return lo <= int(year.name) - int(birth_year.name) <= hi


def _fits(world: World, subject: Entity, rel: str, value: Entity) -> bool:
    """Whether `subject`'s `rel` may be set to `value` and keep the world's years as it draws them
    (an organisation founded 24-60 years after its founder's birth, a work made 20-55 after its
    creator's)."""
    if rel in ("founded_by", "creator"):
        year_rel, lo, hi = _BIRTH_SPANS[rel]
        return _within(world.get(subject, year_rel), world.get(value, "birth_year"), lo, hi)
    if rel in _YEAR_SPANS:
        person_rel, lo, hi = _YEAR_SPANS[rel]
        return _within(value, world.get(world.get(subject, person_rel), "birth_year"), lo, hi)
    if rel == "birth_year":  # the organisations `subject` founded and the works it made
        return all(_within(world.get(d, year_rel), value, lo, hi)
                   for year_rel, (person_rel, lo, hi) in _YEAR_SPANS.items()
                   for d in world.documented() if (d.name, person_rel) in world.rel and world.get(d, person_rel) is subject)
    return True


#: At most this many of a claim's hops have a sibling: each doubles the paths shown (with two, 4
#: from each start: up to 22 documents on 4 hops, before distractors; with three it would be 8).
MAX_SIBLING_HOPS = 2


def _tree(world: World, start: Entity, rels: list[str],
          hops: list[int]) -> tuple[dict[frozenset[int], list[Entity]], list[Entity]] | None:
    """The paths from `start` along every variant of `rels` over `hops`, and their documented
    entities, each once; None if two paths meet (a person born and living in one town, a
    university many people attended): the variants of the hops before the meeting would end alike."""
    variants = [frozenset(c) for n in range(len(hops) + 1) for c in itertools.combinations(hops, n)]
    paths = {v: _walk(world, start, _variant(rels, v)) for v in variants}
    nodes: dict[tuple[frozenset[int], int], Entity] = {}
    for v, path in paths.items():
        for depth in range(len(rels)):  # entity `depth` follows hops 1 .. depth
            nodes[frozenset(j for j in v if j <= depth), depth] = path[depth]
    inner = list(nodes.values())
    return (paths, inner) if len({id(e) for e in inner}) == len(inner) else None


def _square(world: World, rng: random.Random, ents: list[Entity], rels: list[str], near: bool) -> _Square | None:
    """The claim's chain completed to a `_Square`, setting the last fact of every path whose end
    the world did not already make the square's (each set fact one the world could have drawn:
    a year within the spans it draws years in); or None.

    A false value drawn any other way was told from the true one without reading the claim whole
    (each rule below read the labels of hover_easy, hover and hover_hard above a coin): a value
    never mentioned, or mentioned only in another relation, or stated by a subject no document
    mentions, or by one whose mentioner nobody mentions (57-92%); following the claim's relations
    from any start (73-91%); following any k links from the claim's entity (99%, with a twin
    chain from another start shown); ignoring one sibling-bearing hop's relation (71-89%, with the
    false value reached through one swapped hop); counting the documents, reached by any links
    from the claim's entity, that name the value (74-87%, with every one-swap path ending on the
    false value). In the square every sibling-bearing hop's swap flips the end, each value is
    reached by as many paths from either start, and the paths never meet: only the claim's entity
    and every one of its sibling-bearing relations together tell the truth from the false value
    (a hop without a sibling is settled by the types alone: its subject has one fact of its kind)."""
    k, truth = len(rels), ents[-1]
    hops = [j for j in range(1, k + 1) if rels[j - 1] in _SIBLINGS]
    if not hops or len(hops) > MAX_SIBLING_HOPS:
        return None
    found = _tree(world, ents[0], rels, hops)
    if found is None:
        return None
    paths, inner = found
    inner_names = {e.name for e in inner}
    # the near miss: a one-swap path whose own end is another value, one the claim's subject could
    # hold by the world's years, and none of the documented entities' names
    options = [j for j in hops if paths[frozenset([j])][-1].name not in {e.name for e in ents} | inner_names
               and _fits(world, ents[-2], rels[-1], paths[frozenset([j])][-1])]
    if not options:
        return None
    rng.shuffle(options)
    if near and truth.type == "year":
        options.sort(key=lambda j: abs(int(paths[frozenset([j])][-1].name) - int(truth.name)))
    miss = options[0]
    value = paths[frozenset([miss])][-1]
    if truth.name in inner_names:
        return None

    def end(v: frozenset[int], twin: bool) -> Entity:
        return (value if twin else truth) if len(v) % 2 == 0 else (truth if twin else value)

    def plausible(paths: dict[frozenset[int], list[Entity]], twin: bool) -> bool:
        """Whether every path ending on a birth year after a founder/head or creator/dedicatee
        hop ends within the years the world draws an organisation's or work's creator's birth
        in: the founder's always was and the head's need not be, so "does the year fit X's
        founding year" told the two apart (73-87% of such claims)."""
        if rels[-1] != "birth_year" or k < 2 or rels[-2] not in _BIRTH_SPANS:
            return True
        year_rel, lo, hi = _BIRTH_SPANS[rels[-2]]
        return all(_within(world.get(p[-3], year_rel), end(v, twin), lo, hi) for v, p in paths.items())

    if not plausible(paths, twin=False):
        return None

    starts = [x for x in world.entities(ents[0].type) if x is not ents[0] and x.kind == ents[0].kind]
    rng.shuffle(starts)
    for x0 in starts:
        twin_found = _tree(world, x0, rels, hops)
        if twin_found is None:
            continue
        twin_paths, twin_inner = twin_found
        if not plausible(twin_paths, twin=True):
            continue
        if {id(e) for e in twin_inner} & {id(e) for e in inner} or {truth.name, value.name} & {e.name for e in twin_inner}:
            continue
        sets = [(p[-2], _variant(rels, v)[-1], end(v, twin)) for twin, ps in ((False, paths), (True, twin_paths))
                for v, p in ps.items() if p[-1] is not end(v, twin)]
        if not all(_fits(world, *fact) for fact in sets):
            continue
        for subject, rel, v in sets:  # each read by its own path alone: `_tree` keeps the paths apart
            world._set(subject, rel, v)
        square = _Square({v: _walk(world, ents[0], _variant(rels, v)) for v in paths},
                         {v: _walk(world, x0, _variant(rels, v)) for v in twin_paths}, miss, inner + twin_inner)
        assert all(square.paths[v][:-1] == p[:-1] and square.paths[v][-1] is end(v, False) for v, p in paths.items())
        assert all(square.twin_paths[v][:-1] == p[:-1] and square.twin_paths[v][-1] is end(v, True)
                   for v, p in twin_paths.items())
        return square
    return None


def _noun(s: Entity, r: str) -> str:
    """Relation r of s as a noun phrase around its subject: 'the deputy mayor of …'."""
    return (_rel_text(s, r)[1] or "{s}").replace("{s}", "…")


def _phrase(ents: list[Entity], rels: list[str]) -> str:
    """The noun phrase naming e_{k-1}: 'the founder of Kestrel Records'."""
    np = _title(ents[0])
    for s, r in zip(ents, rels[:-1], strict=False):  # e0..e_{k-2} with r1..r_{k-1}
        np = (_rel_text(s, r)[1] or "{s}").format(s=np)
    return np


def _claim(ents: list[Entity], rels: list[str], value: Entity) -> str:
    text = _rel_text(ents[-2], rels[-1])[2].format(s=_phrase(ents, rels), o=_title(value))
    return text[0].upper() + text[1:]
