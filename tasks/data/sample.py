"""Seeded generator of a fictional multi-hop QA corpus (the embedded default dataset).

Design
------
1. **World.** ``n_passages`` invented entities are allotted to six kinds
   (regions, countries, cities, people, organisations, works). Every name is
   composed from syllables drawn with ``random.Random(seed)``; each invented
   word is used by one entity only (people share a pool of first names), so
   titles are unique and a capitalised name points at one passage.
2. **Relations.** Entities are linked in one linear pass: country in region,
   city in country, person born in city, person married to person, organisation
   founded by person and headquartered in a city, work created by a person and
   issued by an organisation, plus distractor links (mentors, twin towns...).
   A relation is stated in exactly one passage (its owner's), never in both.
3. **Passages.** Each entity gets 3-6 sentences in HotpotQA form (sentences
   after the first start with a space, text is their concatenation); the
   index of the sentence carrying each fact is recorded for supporting facts.
   Passage and question templates use different vocabularies ("a native of"
   vs. "born", "main offices" vs. "headquartered") so that later hops can be
   reached only through the entity names, as in real multi-hop benchmarks.
4. **Questions.** Relation paths starting at an anchor entity give bridge
   (2 passages) and compositional (3 passages) questions; pairs of same-kind
   entities give comparison questions. A candidate is dropped when any passage
   after the first shares a content word with the question (see
   :func:`shared_content_words`) or when it touches a reserved entity; about a
   fifth of the entities are reserved so the corpus always has pure distractors.
   Targets are 50% bridge, 25% compositional, 25% comparison; shortfalls of one
   type are topped up by the others, and a corpus too small to yield
   ``n_questions`` distinct questions yields as many as it can.

Everything is linear in ``n_passages`` (no pairwise loops), and the same
arguments always give identical output.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

__all__ = ["generate_sample", "content_words", "shared_content_words", "STOPWORDS"]

STOPWORDS: frozenset[str] = frozenset(
    "the and for was were which what who whom whose that this these those with "
    "from into onto its his her hers their them they she are has had have been "
    "being not but than then there where when how did does also any all both "
    "one its our your you".split()
)
_TOKEN = re.compile(r"[A-Za-z]+")

Question = dict[str, Any]
Passage = dict[str, str]


def _choice(rng: random.Random, seq: Any) -> Any:
    """Uniform pick from a sequence (a faster ``rng.choice``)."""
    return seq[int(rng.random() * len(seq))]


def content_words(text: str) -> set[str]:
    """Lower-cased alphabetic tokens of length >= 3 that are not stopwords."""
    tokens = (t.lower() for t in _TOKEN.findall(text))
    return {t for t in tokens if len(t) >= 3 and t not in STOPWORDS}


def shared_content_words(question: str, passage: str) -> set[str]:
    """Content words that ``question`` and ``passage`` have in common."""
    return content_words(question) & content_words(passage)


# --------------------------------------------------------------------------- names

_ONSETS = ("b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m",
           "n", "p", "r", "s", "sh", "t", "th", "tr", "v", "z", "qu")
_VOWELS = ("a", "e", "i", "o", "u") * 3 + ("ae", "ai", "ou", "ia")
_ENDINGS = {
    "surname": ("", "n", "r", "s", "l", "th", "x", "nd", "rn", "sk", "ck", "ley", "ow"),
    "city": ("", "holm", "by", "ton", "ford", "grad", "vik", "mouth", "stead"),
    "country": ("ia", "ania", "ora", "eth", "mark", "land", "istan"),
    "plain": ("", "n", "r", "l", "x", "th", "s"),
    "female": ("a", "ia", "elle", "ine", "ra", "is"),
    "male": ("o", "an", "ric", "us", "el", "ar"),
}
_MAX_LEN = 11


class _Namer:
    """Draws invented words; each word is handed out at most once."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def word(self, style: str = "plain", short: bool = False) -> str:
        """Return a fresh capitalised word (1-2 syllables if ``short`` else 2-3)."""
        rng = self.rng
        while True:
            n = (1 if short else 2) + (rng.random() < 0.3)
            stem = "".join(_choice(rng, _ONSETS) + _choice(rng, _VOWELS) for _ in range(n))
            w = (stem + _choice(rng, _ENDINGS[style])).capitalize()
            if 4 <= len(w) <= _MAX_LEN and w not in self.used and w.lower() not in STOPWORDS:
                self.used.add(w)
                return w


# --------------------------------------------------------------------------- world


@dataclass(slots=True)
class Entity:
    """One invented entity and, once rendered, its passage."""

    kind: str
    name: str
    attrs: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, int] = field(default_factory=dict)
    sentences: list[str] = field(default_factory=list)
    reserved: bool = False

    @property
    def text(self) -> str:
        """Passage text: the concatenation of the sentences."""
        return "".join(self.sentences)


@dataclass(slots=True)
class _World:
    """All entities plus their ids grouped by kind."""

    ents: list[Entity]
    by_kind: dict[str, list[int]]
    rng: random.Random

    def name(self, eid: int) -> str:
        """Name of entity ``eid``."""
        return self.ents[eid].name

    def pick(self, kind: str, exclude: int = -1) -> int:
        """A random entity id of ``kind`` (other than ``exclude`` when possible)."""
        ids = self.by_kind[kind]
        eid = _choice(self.rng, ids)
        if eid == exclude and len(ids) > 1:
            eid = ids[(ids.index(eid) + 1) % len(ids)]
        return eid


_KINDS = ("region", "country", "city", "org", "work", "person")
_SHARES = {"region": 0.02, "country": 0.06, "city": 0.18, "org": 0.16, "work": 0.18}
_MINIMA = {"region": 1, "country": 2, "city": 3, "org": 3, "work": 3}
_GEO = ("Basin", "Highlands", "Coast", "Plateau", "Steppe", "Marches", "Valley", "Archipelago")
_ORG_SUFFIXES = ("Records", "Press", "Studios", "Institute", "Bank", "Guild", "Foundation",
                 "Works", "Society")
_ORG_WEIGHTS = (3, 3, 3, 1, 1, 1, 1, 1, 1)
_WORK_KINDS = ("novel", "film", "album")
_WORK_NOUNS = ("Tides", "Ashes", "Lanterns", "Echoes", "Orchard", "Winter", "Silence",
               "Embers", "Meridian", "Harbor", "Thistles", "Mirrors", "Saltmarsh")


def _allocate(n_passages: int) -> dict[str, int]:
    """Number of entities of each kind; people take whatever is left."""
    counts = {k: max(_MINIMA[k], int(n_passages * s)) for k, s in _SHARES.items()}
    counts["person"] = n_passages - sum(counts.values())
    return counts


def _entity_name(namer: _Namer, kind: str) -> tuple[str, dict[str, Any]]:
    """Invent a name (and name-derived attributes) for a new entity of ``kind``."""
    rng = namer.rng
    if kind == "region":
        return f"{namer.word()} {_choice(rng, _GEO)}", {}
    if kind in ("country", "city"):
        return namer.word(kind), {}
    if kind == "org":
        suffix = rng.choices(_ORG_SUFFIXES, _ORG_WEIGHTS)[0]
        return f"{namer.word()} {suffix}", {"suffix": suffix}
    if kind == "work":
        w, noun, form = namer.word(), _choice(rng, _WORK_NOUNS), rng.randrange(4)
        title = (w, f"The {w} {noun}", f"{noun} of {w}", f"{w} {noun}")[form]
        return title, {"wkind": _choice(rng, _WORK_KINDS)}
    raise ValueError(kind)


def _first_names(namer: _Namer, count: int) -> list[tuple[str, str]]:
    """A pool of (first name, gender) pairs shared by all people."""
    pool = []
    for i in range(count):
        gender = "female" if i % 2 == 0 else "male"
        pool.append((namer.word(gender, short=True), gender))
    return pool


def _build_entities(rng: random.Random, counts: dict[str, int]) -> _World:
    """Create all named entities, then add their attributes and relations."""
    namer = _Namer(rng)
    pool = _first_names(namer, 120)
    ents: list[Entity] = []
    by_kind: dict[str, list[int]] = {k: [] for k in _KINDS}
    for kind in _KINDS:
        for _ in range(counts[kind]):
            if kind == "person":
                first, gender = _choice(rng, pool)
                name, attrs = f"{first} {namer.word('surname')}", {"gender": gender}
            else:
                name, attrs = _entity_name(namer, kind)
            by_kind[kind].append(len(ents))
            ents.append(Entity(kind, name, attrs))
    world = _World(ents, by_kind, rng)
    _link_all(world, namer)
    return world


# --------------------------------------------------------------------------- relations


def _link_places(world: _World, namer: _Namer) -> None:
    """Regions, countries and cities with their attributes and containment."""
    rng = world.rng
    regions = world.by_kind["region"]
    for rid in regions:
        world.ents[rid].attrs.update(area=rng.randrange(40, 900) * 1000,
                                     peak=namer.word(), height=rng.randrange(900, 6500))
        if len(regions) > 1:
            world.ents[rid].attrs["borders"] = world.pick("region", rid)
    countries = world.by_kind["country"]
    rivers = [namer.word() for _ in range(max(3, len(world.by_kind["city"]) // 4))]
    for cid in countries:
        world.ents[cid].attrs.update(
            region=world.pick("region"), independence=rng.randrange(1790, 1995),
            language=world.name(cid)[:-1] + _choice(rng, ("ic", "ish", "ese")),
            currency=namer.word())
    for i, cid in enumerate(world.by_kind["city"]):
        country = countries[i] if i < len(countries) else _choice(rng, countries)
        if i < len(countries):
            world.ents[country].attrs["capital"] = cid
        world.ents[cid].attrs.update(
            country=country, population=int(10 ** rng.uniform(3.3, 6.6)),
            census=rng.randrange(2001, 2022), settled=rng.randrange(800, 1750),
            river=_choice(rng, rivers), twin=world.pick("city", cid),
            landmark=namer.word())


def _link_people(world: _World, namer: _Namer) -> None:
    """Life dates, birthplaces, awards and so on of people, then family ties."""
    rng = world.rng
    awards = [namer.word() for _ in range(max(4, len(world.by_kind["person"]) // 50))]
    for pid in world.by_kind["person"]:
        born = rng.randrange(1820, 1986)
        death = born + rng.randrange(45, 96)
        last = death if death <= 2023 else 2023
        world.ents[pid].attrs.update(
            birth_year=born, death_year=death if death <= 2023 else None,
            occupation=_choice(rng, _OCCUPATIONS), adjective=_choice(rng, _PERSON_ADJ),
            born_in=world.pick("city"), residence=world.pick("city"),
            award=_choice(rng, awards), award_year=min(born + rng.randrange(25, 45), last),
            legacy=_choice(rng, _LEGACY))
    _link_families(world)


def _link_families(world: _World) -> None:
    """Marry people of similar age and give some of them an older mentor."""
    rng, ents = world.rng, world.ents
    people = sorted(world.by_kind["person"], key=lambda p: ents[p].attrs["birth_year"])
    for i in range(0, len(people) - 1, 2):
        a, b = people[i : i + 2]
        if rng.random() < 0.5:
            a, b = b, a
        pa, pb = ents[a].attrs, ents[b].attrs
        wed = max(pa["birth_year"], pb["birth_year"]) + rng.randrange(20, 36)
        ends = [d for d in (pa["death_year"], pb["death_year"], 2023) if d is not None]
        if rng.random() < 0.7 and wed <= min(ends):
            pa.update(spouse=b, wed_year=wed)
    gap = max(1, len(people) * 20 // 166)
    for i, pid in enumerate(people):
        j = i - rng.randrange(gap, 2 * gap + 1)
        if j < 0:
            continue
        m, p = ents[people[j]].attrs, ents[pid].attrs
        alive = m["death_year"] is None or m["death_year"] >= p["birth_year"] + 18
        if m["birth_year"] + 15 <= p["birth_year"] and alive:
            p["mentor"] = people[j]


def _link_orgs_and_works(world: _World, namer: _Namer) -> None:
    """Founders, headquarters and publishers; creators and settings of works."""
    rng = world.rng
    publishers: dict[str, list[int]] = {s: [] for s in _ORG_SUFFIXES}
    for oid in world.by_kind["org"]:
        founder = world.pick("person")
        attrs = world.ents[oid].attrs
        attrs.update(founder=founder, founded_year=_active_year(world, founder, 22),
                     hq=world.pick("city"), staff=rng.randrange(12, 4000),
                     partner=world.pick("org", oid), emblem=_choice(rng, _EMBLEMS))
        publishers[attrs["suffix"]].append(oid)
    for wid in world.by_kind["work"]:
        attrs = world.ents[wid].attrs
        creator = world.pick("person")
        issuers = publishers[_PUBLISHER_SUFFIX[attrs["wkind"]]]
        attrs.update(creator=creator, year=_active_year(world, creator, 20),
                     genre=_choice(rng, _GENRES[attrs["wkind"]]), setting=world.pick("city"),
                     prize=namer.word(), similar=world.pick("work", wid),
                     size=rng.randrange(*_SIZES[attrs["wkind"]]))
        if issuers:
            attrs["publisher"] = _choice(rng, issuers)


def _active_year(world: _World, pid: int, min_age: int) -> int:
    """A year in which person ``pid`` was alive and at least ``min_age`` old."""
    a = world.ents[pid].attrs
    last = min(a["death_year"] or 2022, 2022)
    first = min(a["birth_year"] + min_age, last)
    return world.rng.randrange(first, max(first, min(last, first + 40)) + 1)


def _link_all(world: _World, namer: _Namer) -> None:
    """Add attributes and relations, then reserve ~20% distractor entities."""
    _link_places(world, namer)
    _link_people(world, namer)
    _link_orgs_and_works(world, namer)
    for ent in world.ents:
        if ent.kind in ("city", "person", "org", "work") and world.rng.random() < 0.2:
            ent.reserved = True


# --------------------------------------------------------------------------- passages

_OCCUPATIONS = ("sculptor", "physician", "novelist", "engineer", "cartographer", "violinist",
                "botanist", "architect", "historian", "poet", "painter", "chemist", "diplomat",
                "merchant", "filmmaker", "composer", "astronomer", "jurist", "photographer",
                "playwright")
_PERSON_ADJ = ("", "noted ", "celebrated ", "reclusive ", "prolific ", "self-taught ")
_LEGACY = ("early experiments", "meticulous notebooks", "public lectures",
           "long correspondence", "quarrels with critics", "generous patronage")
_EMBLEMS = ("a silver heron", "a red lantern", "a green oak", "a golden wheel", "a blue anchor")
_PUBLISHER_SUFFIX = {"novel": "Press", "film": "Studios", "album": "Records"}
_GENRES = {"novel": ("mystery", "historical", "satirical", "pastoral", "epic"),
           "film": ("drama", "comedy", "documentary", "thriller", "western"),
           "album": ("folk", "jazz", "ambient", "rock", "choral")}
_SIZES = {"novel": (180, 900), "film": (80, 200), "album": (7, 19)}
_ORG_DESC = {"Records": "record label", "Press": "publishing house", "Studios": "film studio",
             "Institute": "research institute", "Bank": "private bank", "Guild": "craft guild",
             "Foundation": "charitable trust", "Works": "engineering firm",
             "Society": "learned society"}

Sentence = tuple[tuple[str, ...], str]
Parts = tuple[Sentence, list[Sentence], list[Sentence]]


def _an(word: str) -> str:
    """Indefinite article for ``word``."""
    return "an" if word[:1].lower() in "aeiou" else "a"


def _person_parts(e: Entity, w: _World) -> Parts:
    """Intro, required and optional sentences about a person."""
    a, rng, n = e.attrs, w.rng, e.name
    he, his = ("she", "her") if a["gender"] == "female" else ("he", "his")
    desc = a["adjective"] + a["occupation"]
    if a["death_year"]:
        intro = f"{n} ({a['birth_year']}–{a['death_year']}) was {_an(desc)} {desc}."
    else:
        intro = f"{n} (b. {a['birth_year']}) is {_an(desc)} {desc}."
    city = w.name(a["born_in"])
    born = _choice(rng, (f"{he.capitalize()} was a native of {city}.",
                         f"{n} hailed from {city}.", f"{n} originally came from {city}."))
    required: list[Sentence] = [(("born_in",), born)]
    if "spouse" in a:
        s, y = w.name(a["spouse"]), a["wed_year"]
        required.append((("spouse",), _choice(rng, (f"In {y}, {he} married {s}.",
                                                    f"{he.capitalize()} wed {s} in {y}."))))
    optional: list[Sentence] = [
        (("residence",), f"{he.capitalize()} later settled in {w.name(a['residence'])}."),
        (("award",), f"{he.capitalize()} received the {a['award']} Medal in {a['award_year']}."),
        (("legacy",), f"{n} is chiefly remembered for {his} {a['legacy']}."),
    ]
    if "mentor" in a:
        optional.append((("mentor",), f"{he.capitalize()} trained under {w.name(a['mentor'])}."))
    return (("birth_year", "occupation"), intro), required, optional


def _org_parts(e: Entity, w: _World) -> Parts:
    """Intro, required and optional sentences about an organisation."""
    a, rng, n = e.attrs, w.rng, e.name
    desc = _ORG_DESC[a["suffix"]]
    f, y, hq = w.name(a["founder"]), a["founded_year"], w.name(a["hq"])
    founding = _choice(rng, (f"It was established in {y} by {f}.",
                             f"{f} set up {n} in {y}.", f"{f} launched it in {y}."))
    office = _choice(rng, (f"Its main offices are in {hq}.",
                           f"{n} keeps its head office in {hq}.", f"It operates from {hq}."))
    required: list[Sentence] = [(("founded_year", "founder"), founding), (("hq",), office)]
    optional: list[Sentence] = [
        (("staff",), f"It employs roughly {a['staff']:,} people."),
        (("partner",), f"{n} has a long partnership with {w.name(a['partner'])}."),
        (("emblem",), f"Its emblem is {a['emblem']}."),
    ]
    return (("suffix",), f"{n} is {_an(desc)} {desc}."), required, optional


def _city_parts(e: Entity, w: _World) -> Parts:
    """Intro, required and optional sentences about a city."""
    a, rng, n = e.attrs, w.rng, e.name
    land = w.name(a["country"])
    side = _choice(rng, ("north", "south", "east", "west"))
    intro = _choice(rng, (f"{n} is a town in {land}.",
                          f"{n} is a market town in the {side} of {land}.",
                          f"{n} is a port on the {side} coast of {land}."))
    pop, y = a["population"], a["census"]
    people = _choice(rng, (f"It had {pop:,} inhabitants at the {y} census.",
                           f"Its population was {pop:,} in {y}."))
    optional: list[Sentence] = [
        (("river",), f"The {a['river']} River flows through the town."),
        (("settled",), f"{n} was first settled in {a['settled']}."),
        (("twin",), f"It is twinned with {w.name(a['twin'])}."),
        (("landmark",), f"Its best-known landmark is the {a['landmark']} Bridge."),
    ]
    return (("country",), intro), [(("population",), people)], optional


def _country_parts(e: Entity, w: _World) -> Parts:
    """Intro, required and optional sentences about a country."""
    a, rng, n = e.attrs, w.rng, e.name
    form = _choice(rng, ("sovereign state", "republic", "small kingdom", "federal republic"))
    intro = f"{n} is {_an(form)} {form} in the {w.name(a['region'])}."
    cap = w.name(a["capital"])
    required: list[Sentence] = [
        (("capital",), _choice(rng, (f"Its capital is {cap}.",
                                     f"The seat of government is {cap}."))),
        (("independence",), _choice(rng, (f"It gained independence in {a['independence']}.",
                                          f"{n} became independent in {a['independence']}."))),
    ]
    optional: list[Sentence] = [
        (("language",), f"The official language is {a['language']}."),
        (("currency",), f"Its currency is the {a['currency']}."),
    ]
    return (("region",), intro), required, optional


def _region_parts(e: Entity, w: _World) -> Parts:
    """Intro, required and optional sentences about a region."""
    a, rng, n = e.attrs, w.rng, e.name
    terrain = _choice(rng, ("lowlands and marshes", "uplands and lakes", "dry plains",
                            "forests and river gorges"))
    optional: list[Sentence] = [
        (("peak",), f"Its highest point is Mount {a['peak']}, at {a['height']:,} metres."),
        (("climate",), f"The climate is {_choice(rng, ('mild', 'harsh', 'humid', 'arid'))}."),
    ]
    required: list[Sentence] = [(("area",), f"It covers roughly {a['area']:,} square kilometres.")]
    if "borders" in a:
        required.append((("borders",), f"It borders the {w.name(a['borders'])}."))
    return (("terrain",), f"{n} is a broad area of {terrain}."), required, optional


def _work_parts(e: Entity, w: _World) -> Parts:
    """Intro, required and optional sentences about a book, film or album."""
    a, n = e.attrs, e.name
    kind, genre, creator = a["wkind"], a["genre"], w.name(a["creator"])
    verb = {"novel": "written", "film": "directed", "album": "recorded"}[kind]
    intro = f"{n} is {_an(genre)} {genre} {kind} {verb} by {creator}."
    out = {"novel": "published", "film": "screened", "album": "released"}[kind]
    required: list[Sentence] = [(("year",), f"It was first {out} in {a['year']}.")]
    if "publisher" in a:
        p = w.name(a["publisher"])
        how = {"novel": f"It was published by {p}.", "film": f"It was produced by {p}.",
               "album": f"It came out on {p}."}[kind]
        required.append((("publisher",), how))
    place = w.name(a["setting"])
    size = {"novel": f"It runs to {a['size']} pages.", "film": f"It runs for {a['size']} minutes.",
            "album": f"It contains {a['size']} tracks."}[kind]
    optional: list[Sentence] = [
        (("setting",), f"It was recorded in {place}." if kind == "album"
         else f"The story is set in {place}."),
        (("prize",), f"It won the {a['prize']} Prize."),
        (("similar",), f"Critics have likened it to {w.name(a['similar'])}."),
        (("size",), size),
    ]
    return (("creator", "genre"), intro), required, optional


_PARTS: dict[str, Callable[[Entity, _World], Parts]] = {
    "person": _person_parts, "org": _org_parts, "city": _city_parts,
    "country": _country_parts, "region": _region_parts, "work": _work_parts,
}


def _render(e: Entity, w: _World) -> None:
    """Fill ``e.sentences`` (3-6, HotpotQA spacing) and ``e.facts``."""
    intro, required, optional = _PARTS[e.kind](e, w)
    rng = w.rng
    lo = max(0, 2 - len(required))
    hi = max(lo, min(len(optional), 5 - len(required)))
    body = required + rng.sample(optional, rng.randint(lo, hi))
    rng.shuffle(body)
    e.sentences, e.facts = [], {}
    for i, (keys, sent) in enumerate([intro, *body]):
        e.sentences.append(sent if i == 0 else " " + sent)
        for key in keys:
            e.facts[key] = i


# --------------------------------------------------------------------------- questions


@dataclass(frozen=True, slots=True)
class _Chain:
    """A relation path from an anchor entity; the last step is the answer."""

    qtype: str
    kind: str
    path: tuple[str, ...]
    template: str


_ROLE = {"novel": "the author of {A}", "film": "the director of {A}",
         "album": "the musician who recorded {A}"}
_CHAINS = (
    _Chain("bridge", "org", ("founder", "born_in"), "In which city was the founder of {A} born?"),
    _Chain("bridge", "org", ("founder", "birth_year"),
           "In what year was the founder of {A} born?"),
    _Chain("bridge", "work", ("creator", "born_in"), "In which city was {R} born?"),
    _Chain("bridge", "work", ("creator", "spouse"), "Who was the spouse of {R}?"),
    _Chain("bridge", "work", ("creator", "occupation"), "What was the profession of {R}?"),
    _Chain("bridge", "work", ("publisher", "founder"),
           "Who founded the organisation that issued {A}?"),
    _Chain("bridge", "work", ("publisher", "hq"),
           "In which city is the organisation that issued {A} based?"),
    _Chain("bridge", "person", ("born_in", "country"), "In which country was {A} born?"),
    _Chain("bridge", "person", ("spouse", "born_in"), "In which city was the spouse of {A} born?"),
    _Chain("bridge", "org", ("hq", "country"), "In which country is {A} headquartered?"),
    _Chain("bridge", "city", ("country", "region"),
           "Which region is home to the nation that contains {A}?"),
    _Chain("compositional", "org", ("founder", "born_in", "country"),
           "In which country was the founder of {A} born?"),
    _Chain("compositional", "work", ("creator", "born_in", "country"),
           "In which country was {R} born?"),
    _Chain("compositional", "work", ("creator", "spouse", "born_in"),
           "In which city was the spouse of {R} born?"),
    _Chain("compositional", "work", ("publisher", "hq", "country"),
           "In which country is the organisation that issued {A} based?"),
    _Chain("compositional", "work", ("publisher", "founder", "born_in"),
           "In which city was the founder of the organisation that issued {A} born?"),
    _Chain("compositional", "org", ("founder", "spouse", "born_in"),
           "In which city was the spouse of the founder of {A} born?"),
    _Chain("compositional", "person", ("born_in", "country", "region"),
           "In which region is the country where {A} was born?"),
    _Chain("compositional", "org", ("hq", "country", "region"),
           "Which region is home to the nation where {A} is headquartered?"),
)
_RELATIONS = frozenset({"founder", "born_in", "spouse", "creator", "publisher", "hq",
                        "country", "region"})


@dataclass(frozen=True, slots=True)
class _Compare:
    """A comparison of one numeric attribute between two same-kind entities."""

    kind: str
    attr: str
    template: str
    smaller_wins: bool


_COMPARES = (
    _Compare("person", "birth_year", "Who was born first, {X} or {Y}?", True),
    _Compare("org", "founded_year", "Which was founded earlier, {X} or {Y}?", True),
    _Compare("work", "year", "Which came out earlier, {X} or {Y}?", True),
    _Compare("city", "population", "Which has the larger population, {X} or {Y}?", False),
    _Compare("country", "independence", "Which gained independence earlier, {X} or {Y}?", True),
)


def _record(question: str, answer: str, qtype: str, gold: list[tuple[Entity, int]]) -> Question:
    """A HotpotQA-shaped record (``_id`` is filled in later)."""
    return {
        "_id": "", "question": question, "answer": answer,
        "supporting_facts": [[e.name, i] for e, i in gold],
        "context": [[e.name, list(e.sentences)] for e, _ in gold],
        "type": qtype, "level": "medium",
    }


def _walk(w: _World, anchor: int, path: tuple[str, ...]) -> tuple[list[Entity], Any] | None:
    """Follow ``path`` from ``anchor``: (gold entities, final value) or None."""
    hops, cur = [], w.ents[anchor]
    for key in path:
        if cur.reserved or key not in cur.attrs or key not in cur.facts or cur in hops:
            return None
        hops.append(cur)
        value = cur.attrs[key]
        if key not in _RELATIONS:
            return hops, value
        cur = w.ents[value]
    return hops, cur.name


def _chain_question(w: _World, chain: _Chain, anchor: int) -> Question | None:
    """Build ``chain``'s question for ``anchor`` if it is valid, else None."""
    walked = _walk(w, anchor, chain.path)
    if walked is None:
        return None
    hops, answer = walked
    a = hops[0]
    role = _ROLE[a.attrs["wkind"]].format(A=a.name) if a.kind == "work" else ""
    question = chain.template.format(A=a.name, R=role)
    answer = str(answer)
    if answer.lower() in question.lower():
        return None
    if any(shared_content_words(question, h.text) for h in hops[1:]):
        return None
    gold = [(h, h.facts[key]) for h, key in zip(hops, chain.path)]
    return _record(question, answer, chain.qtype, gold)


def _compare_question(w: _World, comp: _Compare, x: int, y: int) -> Question | None:
    """Comparison question for entities ``x`` and ``y`` if valid, else None."""
    ex, ey = w.ents[x], w.ents[y]
    if x == y or ex.reserved or ey.reserved:
        return None
    if comp.attr not in ex.facts or comp.attr not in ey.facts:
        return None
    vx, vy = ex.attrs[comp.attr], ey.attrs[comp.attr]
    if vx == vy:
        return None
    winner = ex if (vx < vy) == comp.smaller_wins else ey
    question = comp.template.format(X=ex.name, Y=ey.name)
    gold = [(ex, ex.facts[comp.attr]), (ey, ey.facts[comp.attr])]
    return _record(question, winner.name, "comparison", gold)


def _chain_stream(w: _World, chain: _Chain) -> Iterator[Question]:
    """Valid questions for ``chain``, anchors visited once from a random offset."""
    ids = w.by_kind[chain.kind]
    start = w.rng.randrange(len(ids))
    for i in range(len(ids)):
        q = _chain_question(w, chain, ids[(start + i) % len(ids)])
        if q is not None:
            yield q


def _compare_stream(w: _World, comp: _Compare) -> Iterator[Question]:
    """Valid comparison questions for ``comp`` over disjoint random pairs."""
    ids = list(w.by_kind[comp.kind])
    w.rng.shuffle(ids)
    for x, y in zip(ids[0::2], ids[1::2]):
        q = _compare_question(w, comp, x, y)
        if q is not None:
            yield q


def _take(streams: list[Iterator[Question]], need: int, seen: set[str]) -> list[Question]:
    """Round-robin up to ``need`` unseen questions; exhausted streams are dropped."""
    out: list[Question] = []
    while streams and len(out) < need:
        for s in list(streams):
            if len(out) >= need:
                break
            q = next(s, None)
            if q is None:
                streams.remove(s)
            elif q["question"] not in seen:
                seen.add(q["question"])
                out.append(q)
    return out


def _questions(w: _World, n_questions: int, seed: int) -> list[Question]:
    """Questions in a 50/25/25 bridge/compositional/comparison mix, shuffled, with ids."""
    streams: dict[str, list[Iterator[Question]]] = {"bridge": [], "compositional": [],
                                                   "comparison": []}
    for chain in _CHAINS:
        streams[chain.qtype].append(_chain_stream(w, chain))
    for comp in _COMPARES:
        streams["comparison"].append(_compare_stream(w, comp))
    n_bridge = (n_questions + 1) // 2
    n_comp = (n_questions - n_bridge + 1) // 2
    targets = {"bridge": n_bridge, "compositional": n_comp,
               "comparison": n_questions - n_bridge - n_comp}
    seen: set[str] = set()
    out: list[Question] = []
    for qtype, need in targets.items():
        out += _take(streams[qtype], need, seen)
    leftovers = [s for group in streams.values() for s in group]
    out += _take(leftovers, n_questions - len(out), seen)
    w.rng.shuffle(out)
    for i, q in enumerate(out):
        q["_id"] = hashlib.sha1(f"{seed}:{i}:{q['question']}".encode()).hexdigest()[:24]
    return out


# --------------------------------------------------------------------------- entry point


def generate_sample(n_passages: int = 300, n_questions: int = 60,
                    seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Return (corpus, questions) in HippoRAG/HotpotQA format.

    ``corpus`` holds ``{"title", "text"}`` passages, one per invented entity, in
    random order. ``questions`` holds HotpotQA records whose ``context`` lists
    only the gold passages. When the corpus cannot support ``n_questions``
    distinct valid questions, fewer are returned. Requires ``n_passages >= 20``.
    """
    if n_passages < 20:
        raise ValueError(f"n_passages must be >= 20, got {n_passages}")
    if n_questions < 0:
        raise ValueError(f"n_questions must be >= 0, got {n_questions}")
    rng = random.Random(seed)
    world = _build_entities(rng, _allocate(n_passages))
    for ent in world.ents:
        _render(ent, world)
    order = list(range(len(world.ents)))
    rng.shuffle(order)
    corpus = [{"title": world.ents[i].name, "text": world.ents[i].text} for i in order]
    return corpus, _questions(world, n_questions, seed)
