"""Generate the embedded sample data: a toy translation task and a toy summarization task.

Both tasks are synthetic, so the data is free to ship, fully reproducible, and a tiny model can
learn them in minutes on a CPU. Everything comes from seeded `random.Random` instances (whose
Mersenne Twister stream is stable across Python 3 versions), so

    python scripts/make_data.py

rewrites data_samples/translation/ and data_samples/summarization/ byte for byte identically.
Each folder holds the legacy layout {train,val,test}.{source,target}, one example per line.

- translation: English-like sentences -> "Velish", an invented language. Words are translated
  through a fixed lexicon, nouns take a plural suffix, adjectives follow their noun, the verb goes
  to the end of its clause and time phrases move to the front; names, digits and punctuation are
  copied, except clock times ("7:30" -> "7h30").
- summarization: news-like passages of 2-6 sentences; the target is a headline
  "<actor> <verb> <object> in <place>" taken from the one sentence that reports the event.

A larger, more length-varied test set for benchmarks (not committed) comes from another seed:

    python scripts/make_data.py --task translation --bench 5000 --out bench_data
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Callable, NamedTuple

SEED = 1234
BENCH_SEED = 98765
TASKS = ("translation", "summarization")
SPLITS = ("train", "val", "test")
# Test sizes are deliberately prime, so no batch size divides them and the last batch is ragged.
DEFAULT_SIZES = {
    "translation": {"train": 20000, "val": 200, "test": 397},
    "summarization": {"train": 10000, "val": 200, "test": 311},
}
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "data_samples"


# --------------------------------------------------------------------------------------------
# Translation: lexicon
# --------------------------------------------------------------------------------------------

NAMES = (
    "Ana Amélie André Åsa Björn Chloé Clara Dario Elif Emil Erik Eva Felix François Greta Hugo "
    "Inés Ivan Jonas José Jürgen Karin Léa Lukas Maja Marta Mateo Nadia Noël Olga Omar Paulo "
    "Renée Rosa Sami Søren Tomás Vera Zoë"
).split()

# (singular, plural) - only irregular plurals are spelled out.
NOUNS = (
    "apple bag baker ball basket bell bicycle bird blanket boat book bottle box bread bridge "
    "brother bucket cake camera candle car carpet castle cat chair cheese child church city "
    "clock cloud coat cook cow cup desk doctor dog door dragon dress drum egg farmer fence field "
    "fish flag flower forest fox friend garden gate ghost gift girl glass goat guitar hammer hat "
    "hill horse hospital house island jacket jar kettle key king kitchen knife ladder lake lamp "
    "letter library lion map market mirror monkey moon mountain mouse museum neighbor nurse "
    "painter parrot pen pencil piano picture pillow pilot plate poet pot queen rabbit river road "
    "roof room rope sailor school sheep ship shoe shop singer sister soldier spoon station stone "
    "street student sword table teacher tent tiger tower town toy train tree truck umbrella "
    "village violin wagon wall watch whale window wolf woman"
).split()
IRREGULAR_PLURALS = {
    "child": "children", "fish": "fish", "knife": "knives", "mouse": "mice", "sheep": "sheep",
    "shelf": "shelves", "wolf": "wolves", "woman": "women",
}

ADJECTIVES = (
    "ancient angry beautiful big bitter black blue brave bright broken busy calm cheap clean "
    "clever cold cruel curious dark deep dirty dry empty famous fast fresh friendly full gentle "
    "golden green happy heavy hidden honest hungry huge kind large lazy little lonely long loud "
    "lucky modern narrow new noisy old polite poor proud quiet rich round sad sharp short silent "
    "simple slow small soft strange strong sweet tall tiny tired warm weak wet white wide wild "
    "wooden yellow young"
).split()

# Regular verbs only, so the English forms follow from spelling rules.
TRANSITIVE_VERBS = (
    "accept admire answer borrow carry check clean climb collect cook count cover deliver "
    "describe destroy discover enjoy examine fill fix follow greet guard help hunt kick lift "
    "like love mark measure mend open order pack paint park pick plant polish print protect "
    "pull push reach repair rescue save search share sort study touch trust visit want warn "
    "wash watch"
).split()
INTRANSITIVE_VERBS = (
    "appear arrive bark complain cough cry dance disappear hurry jump laugh listen pray relax "
    "remain rest return scream shout smile stay talk travel wait walk whisper work yawn"
).split()

ADVERBS = (
    "again always badly carefully early easily gently happily late loudly often politely "
    "proudly quickly quietly rarely sadly slowly suddenly together"
).split()
PREPOSITIONS = "across around behind beside from inside into near outside through towards under with without".split()
DETS_SINGULAR = "the a this that every my your his her our their".split()
DETS_PLURAL = "the these those some many my your his her our their".split()
CONJUNCTIONS = ((", and", "and"), (", but", "but"), (" because", "because"), (", so", "so"),
                (" while", "while"), (", although", "although"), (" when", "when"))
TIME_WORDS = "today yesterday tomorrow tonight".split()

CONSONANTS = "b d f g k l m n p r s t v z ñ sk tr br kl st".split()
VOWELS = "a e i o u a e o ä é ø".split()
CODAS = ["", "", "", "n", "r", "l", "s", "k"]


class Lexicon(NamedTuple):
    """English word (base form) -> Velish stem, plus the rule-based inflections."""

    words: dict[str, str]

    def noun(self, noun: str, plural: bool) -> str:
        stem = self.words[noun]
        if not plural:
            return stem
        # Plural suffix depends only on the stem's last letter: a rule a model can learn.
        return stem + ("ën" if stem[-1] in "aeiouäéø" else "i")

    def verb(self, verb: str, past: bool) -> str:
        return self.words[verb] + ("ét" if past else "a")


def pseudo_word(rng: random.Random, syllables: int) -> str:
    parts = [rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(syllables)]
    return "".join(parts) + rng.choice(CODAS)


def inflections(stem: str) -> set[str]:
    return {stem, stem + "i", stem + "ën", stem + "a", stem + "ét"}


def build_lexicon(seed: int) -> Lexicon:
    """Invent one distinct Velish word per English word; short ones for function words."""
    rng = random.Random(f"{seed}-lexicon")
    function_words = (DETS_SINGULAR + DETS_PLURAL + PREPOSITIONS
                      + [c[1] for c in CONJUNCTIONS] + ["in", "at"])
    content_words = NOUNS + ADJECTIVES + TRANSITIVE_VERBS + INTRANSITIVE_VERBS + ADVERBS + TIME_WORDS
    words: dict[str, str] = {}
    used: set[str] = set()
    for english in dict.fromkeys(function_words + content_words):  # ordered, deduplicated
        syllables = 1 if english in function_words else rng.choice((2, 2, 3))
        candidate = pseudo_word(rng, syllables)
        # No inflected form may coincide with any form of another word, or with a name.
        while used & inflections(candidate) or candidate.capitalize() in NAMES:
            candidate = pseudo_word(rng, syllables)
        words[english] = candidate
        used |= inflections(candidate)
    return Lexicon(words)


# --------------------------------------------------------------------------------------------
# Translation: grammar
# --------------------------------------------------------------------------------------------

class Phrase(NamedTuple):
    """The same phrase in both languages, as word lists."""

    src: list[str]
    tgt: list[str]


def english_plural(noun: str) -> str:
    if noun in IRREGULAR_PLURALS:
        return IRREGULAR_PLURALS[noun]
    if noun.endswith(("s", "sh", "ch", "x", "z")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def english_third_person(verb: str) -> str:
    if verb.endswith(("s", "sh", "ch", "x", "z")):
        return verb + "es"
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


def english_past(verb: str) -> str:
    if verb.endswith("e"):
        return verb + "d"
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ied"
    return verb + "ed"


def pick_count(rng: random.Random, n_options: tuple[int, ...], weights: tuple[float, ...]) -> int:
    return rng.choices(n_options, weights=weights)[0]


def number_token(rng: random.Random) -> str:
    return str(rng.choice((rng.randint(2, 12), rng.randint(13, 99), rng.randint(100, 999), rng.randint(1000, 9999))))


def noun_phrase(rng: random.Random, lex: Lexicon) -> tuple[Phrase, bool]:
    """A name or [det|number] adj* noun. Returns the phrase and whether it is plural."""
    if rng.random() < 0.15:
        name = rng.choice(NAMES)
        return Phrase([name], [name]), False
    noun = rng.choice(NOUNS)
    adjectives = [rng.choice(ADJECTIVES) for _ in range(pick_count(rng, (0, 1, 2), (0.5, 0.35, 0.15)))]
    plural = rng.random() < 0.4
    if plural and rng.random() < 0.3:
        number = number_token(rng)
        src_det, tgt_det = [number], [number]
    else:
        det = rng.choice(DETS_PLURAL if plural else DETS_SINGULAR)
        src_det, tgt_det = [det], [lex.words[det]]
    english_noun = english_plural(noun) if plural else noun
    src = src_det + adjectives + [english_noun]
    if src[0] == "a" and src[1][0] in "aeiou":
        src[0] = "an"
    tgt = tgt_det + [lex.noun(noun, plural)] + [lex.words[a] for a in adjectives]
    return Phrase(src, tgt), plural


def time_phrase(rng: random.Random, lex: Lexicon) -> Phrase:
    kind = rng.random()
    if kind < 0.35:
        year = str(rng.randint(1850, 2030))
        return Phrase(["in", year], [lex.words["in"], year])
    if kind < 0.65:
        hour, minute = rng.randint(1, 12), rng.choice((0, 15, 20, 30, 45))
        # Clock times are the one number that changes form, so the model cannot only copy digits.
        return Phrase(["at", f"{hour}:{minute:02d}"], [lex.words["at"], f"{hour}h{minute:02d}"])
    word = rng.choice(TIME_WORDS)
    return Phrase([word], [lex.words[word]])


def clause(rng: random.Random, lex: Lexicon) -> Phrase:
    """English order: S V [O] [PP] [Adv] [Time]; Velish order: [Time] S [PP] [O] [Adv] V."""
    subject, plural = noun_phrase(rng, lex)
    transitive = rng.random() < 0.7
    verb = rng.choice(TRANSITIVE_VERBS if transitive else INTRANSITIVE_VERBS)
    past = rng.random() < 0.5
    english_verb = english_past(verb) if past else (verb if plural else english_third_person(verb))
    obj = noun_phrase(rng, lex)[0] if transitive else Phrase([], [])
    pp = Phrase([], [])
    if rng.random() < 0.35:
        prep = rng.choice(PREPOSITIONS)
        inner = noun_phrase(rng, lex)[0]
        pp = Phrase([prep] + inner.src, [lex.words[prep]] + inner.tgt)
    adverb = Phrase([], [])
    if rng.random() < 0.3:
        word = rng.choice(ADVERBS)
        adverb = Phrase([word], [lex.words[word]])
    when = time_phrase(rng, lex) if rng.random() < 0.2 else Phrase([], [])
    src = subject.src + [english_verb] + obj.src + pp.src + adverb.src + when.src
    tgt = when.tgt + subject.tgt + pp.tgt + obj.tgt + adverb.tgt + [lex.verb(verb, past)]
    return Phrase(src, tgt)


def capitalize(text: str) -> str:
    return text[:1].upper() + text[1:]


CLAUSE_COUNTS = {
    # Mostly short sentences with a long tail, so batching by length matters.
    "default": ((1, 2, 3, 4, 5, 6), (0.33, 0.24, 0.17, 0.12, 0.08, 0.06)),
    "wide": ((1, 2, 3, 4, 5, 6, 7), (1, 1, 1, 1, 1, 1, 1)),
}


def translation_example(rng: random.Random, lex: Lexicon, profile: str) -> tuple[str, str]:
    counts, weights = CLAUSE_COUNTS[profile]
    n_clauses = pick_count(rng, counts, weights)
    first = clause(rng, lex)
    src, tgt = " ".join(first.src), " ".join(first.tgt)
    for _ in range(n_clauses - 1):
        src_conj, key = rng.choice(CONJUNCTIONS)
        tgt_conj = src_conj.replace(key, lex.words[key])
        nxt = clause(rng, lex)
        src += f"{src_conj} {' '.join(nxt.src)}"
        tgt += f"{tgt_conj} {' '.join(nxt.tgt)}"
    end = "!" if rng.random() < 0.15 else "."
    return capitalize(src) + end, capitalize(tgt) + end


# --------------------------------------------------------------------------------------------
# Summarization
# --------------------------------------------------------------------------------------------

FIRST_NAMES = (
    "Agnès Aino Álvaro Anders Ángela Astrid Beatriz Bjørn Céline Dagný Émile Enzo Fatma Gökhan "
    "Håkon Hélène Ingrid Joaquín Józef Kerstin Laia Lars Łucja Magnús Mette Miloš Nuño Oddný "
    "Pál Petra Ramón Rūta Sigrún Stefan Thérèse Tuomas Ulla Václav Wiebke Zoltán"
).split()
SURNAMES = (
    "Aalto Ahlström Berisha Brandão Čapek Dahl Dumont Eriksen Fernández Gómez Haugen Ibáñez "
    "Jansson Kowalczyk Kuusela Laurent Lindqvist Møller Novák Núñez Ólafsson Petit Quist Rönnberg "
    "Sánchez Schröder Søndergaard Szabó Thorsen Varga Weiß Wójcik Yılmaz Zeller"
).split()
ORGANIZATIONS = (
    "Nordvik Energi", "Café Lumière", "Banco Núñez", "the Ørsted Foundation", "Théâtre du Nord",
    "Brücke Verlag", "the Åland Rowing Club", "Studio Kvist", "Hôtel Bellevue", "the Tórshavn Choir",
)
PLACES = (
    "Århus Bergen Bogotá Brno Córdoba Düsseldorf Gdańsk Genève Göteborg Kraków Köln Lisboa "
    "Ljubljana Lyon Malmö Nîmes Oslo Porto Reykjavík Sevilla Tampere Tórshavn Tromsø Turku "
    "Valencia Vilnius Zürich Łódź"
).split() + ["São Paulo", "Las Palmas", "La Coruña"]
ROLES = ("the mayor", "a local architect", "the head coach", "a retired teacher", "the founder",
         "a young engineer", "the museum director", "a well-known chef", "the regional minister",
         "a volunteer", "the company's chairwoman", "a former sailor")
ORG_ROLES = ("the local company", "a family business", "the cultural group", "the non-profit")

# (past, present) - the passive voice reuses the past form.
EVENT_VERBS = (
    ("opened", "opens"), ("unveiled", "unveils"), ("launched", "launches"), ("won", "wins"),
    ("signed", "signs"), ("sold", "sells"), ("bought", "buys"), ("repaired", "repairs"),
    ("closed", "closes"), ("planted", "plants"), ("painted", "paints"), ("presented", "presents"),
    ("donated", "donates"), ("found", "finds"), ("built", "builds"), ("restored", "restores"),
    ("organized", "organizes"), ("cancelled", "cancels"), ("approved", "approves"),
    ("rejected", "rejects"), ("tested", "tests"), ("released", "releases"),
)
EVENT_OBJECTS = (
    "new bridge", "old library", "solar farm", "rare manuscript", "city marathon", "jazz festival",
    "public swimming pool", "night market", "football stadium", "science museum", "ferry line",
    "wind turbine", "bakery", "children's hospital", "bicycle path", "concert hall", "ice rink",
    "harbour crane", "botanical garden", "chess tournament", "film festival", "fishing boat",
    "mountain hut", "train station", "opera house", "art prize", "student dormitory", "town square",
    "lighthouse", "water tower", "street mural", "electric bus", "rescue boat", "vineyard",
)
COUNTED_OBJECTS = ("trees", "new bicycles", "electric buses", "apartments", "paintings",
                   "benches", "solar panels", "old trams", "street lamps", "school computers")
WEEKDAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
MONTHS = ("January February March April May June July August September October November "
          "December").split()
WORK = ("planning", "negotiations", "debate", "construction", "fundraising", "delays")
WEATHER = ("sunny", "cold", "windy", "rainy", "mild", "foggy")
LANDMARKS = ("harbour", "cathedral", "old town", "central station", "university", "market hall")


class Event(NamedTuple):
    actor: str
    surname: str  # how quotes refer to the actor
    is_person: bool
    past: str
    present: str
    obj: str  # with its article, as in the passage
    head: str  # without its article, as in the headline
    plural: bool
    place: str


def person(rng: random.Random) -> tuple[str, str]:
    first, last = rng.choice(FIRST_NAMES), rng.choice(SURNAMES)
    return f"{first} {last}", last


def pick_event(rng: random.Random) -> Event:
    if rng.random() < 0.8:
        actor, surname = person(rng)
        is_person = True
    else:
        actor = rng.choice(ORGANIZATIONS)
        surname, is_person = "a spokesperson", False
    past, present = rng.choice(EVENT_VERBS)
    if rng.random() < 0.2:
        head = f"{rng.choice((rng.randint(3, 99), rng.randint(100, 999), rng.randint(1000, 5000)))} {rng.choice(COUNTED_OBJECTS)}"
        obj, plural = head, True
    else:
        head = rng.choice(EVENT_OBJECTS)
        article = rng.choice(("the", "a"))
        if article == "a" and head[0] in "aeiou":
            article = "an"
        obj, plural = f"{article} {head}", False
    return Event(actor, surname, is_person, past, present, obj, head, plural, rng.choice(PLACES))


def other_place(rng: random.Random, place: str) -> str:
    return rng.choice([p for p in PLACES if p != place])


def event_sentence(rng: random.Random, ev: Event) -> str:
    """The one sentence that states who did what where; the headline is read off it."""
    role = rng.choice(ROLES if ev.is_person else ORG_ROLES)
    day = rng.choice(WEEKDAYS)
    templates = (
        lambda: f"{ev.actor}, {role}, {ev.past} {ev.obj} in {ev.place} on {day}.",
        lambda: f"On {day}, {ev.actor} {ev.past} {ev.obj} in {ev.place}.",
        lambda: f"In {ev.place}, {ev.actor} {ev.past} {ev.obj} after {rng.randint(2, 40)} months of {rng.choice(WORK)}.",
        lambda: f"{ev.obj} {'were' if ev.plural else 'was'} {ev.past} by {ev.actor} in {ev.place} on {day}.",
        lambda: f"{ev.actor} {ev.past} {ev.obj} in {ev.place} on {rng.choice(MONTHS)} {rng.randint(1, 28)}, {rng.randint(1990, 2030)}.",
    )
    return capitalize(rng.choice(templates)())


def context_sentence(rng: random.Random, ev: Event) -> str:
    """An opening sentence before the event, naming other people and places as distractors."""
    templates = (
        lambda: f"After {rng.randint(2, 9)} weeks of rain, the streets of {other_place(rng, ev.place)} were finally dry.",
        lambda: f"Residents of {ev.place} had waited {rng.randint(2, 30)} years for this moment.",
        lambda: f"It was a busy week for {person(rng)[0]}, who spent {rng.randint(2, 6)} days in {other_place(rng, ev.place)}.",
        lambda: f"Few expected much news from {ev.place} this {rng.choice(MONTHS)}.",
    )
    return rng.choice(templates)()


def filler_templates(rng: random.Random, ev: Event) -> list[Callable[[], str]]:
    speaker = ev.surname if ev.is_person else "a spokesperson"
    return [
        lambda: f"The project cost {rng.randint(1, 90)}.{rng.randint(1, 9)} million euros, according to {person(rng)[0]}.",
        lambda: f"About {rng.randint(1, 60):d},{rng.randint(0, 999):03d} people attended the ceremony.",
        lambda: f"“It is a great day for {ev.place},” said {speaker}.",
        lambda: f"Critics in {other_place(rng, ev.place)} called the plan too expensive.",
        lambda: f"The next meeting is planned for {rng.choice(MONTHS)} {rng.randint(1, 28)}.",
        lambda: f"Last year, {person(rng)[0]} visited {other_place(rng, ev.place)} with {rng.randint(2, 40)} colleagues.",
        lambda: f"Local media reported that {rng.randint(5, 400)} volunteers helped.",
        lambda: f"{capitalize(speaker)} thanked the residents of {ev.place} for their patience.",
        lambda: f"Tickets cost {rng.randint(5, 250)} kronor, and the event sold out in {rng.randint(2, 48)} hours.",
        lambda: f"Police closed {rng.randint(2, 12)} streets near the {rng.choice(LANDMARKS)} for the day.",
        lambda: f"The weather in {ev.place} was {rng.choice(WEATHER)}, with temperatures near {rng.randint(-5, 32)} degrees.",
        lambda: f"A second phase is expected in {rng.randint(2025, 2040)}.",
    ]


FILLER_COUNTS = {
    "default": ((1, 2, 3, 4), (0.3, 0.3, 0.25, 0.15)),
    "wide": ((1, 2, 3, 4, 5, 6), (1, 1, 1, 1, 1, 1)),
}


def summarization_example(rng: random.Random, profile: str) -> tuple[str, str]:
    ev = pick_event(rng)
    sentences = [context_sentence(rng, ev)] if rng.random() < 0.3 else []
    sentences.append(event_sentence(rng, ev))
    counts, weights = FILLER_COUNTS[profile]
    fillers = filler_templates(rng, ev)
    rng.shuffle(fillers)
    sentences += [make() for make in fillers[: pick_count(rng, counts, weights)]]
    headline = f"{ev.actor} {ev.present} {ev.head} in {ev.place}"
    return " ".join(sentences), capitalize(headline)


# --------------------------------------------------------------------------------------------
# Splits and files
# --------------------------------------------------------------------------------------------

def make_split(task: str, n: int, rng: random.Random, profile: str, exclude: set[str]) -> list[tuple[str, str]]:
    """n examples whose sources are distinct and not in `exclude` (so test never leaks train)."""
    lex = build_lexicon(SEED)
    examples: list[tuple[str, str]] = []
    seen = set(exclude)
    while len(examples) < n:
        if task == "translation":
            src, tgt = translation_example(rng, lex, profile)
        else:
            src, tgt = summarization_example(rng, profile)
        if src not in seen:
            seen.add(src)
            examples.append((src, tgt))
    return examples


def write_split(folder: Path, split: str, examples: list[tuple[str, str]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for side, index in (("source", 0), ("target", 1)):
        text = "".join(example[index] + "\n" for example in examples)
        # newline="\n" keeps the bytes identical on every platform.
        with open(folder / f"{split}.{side}", "w", encoding="utf-8", newline="\n") as f:
            f.write(text)


def generate_task(task: str, sizes: dict[str, int], out: Path, seed: int, profile: str) -> None:
    """Splits are drawn in a fixed order from one stream per (seed, task, split); later splits
    exclude earlier sources, so val and test never repeat a training example."""
    seen: set[str] = set()
    for split in SPLITS:
        if split not in sizes:
            continue
        rng = random.Random(f"{seed}-{task}-{split}")
        examples = make_split(task, sizes[split], rng, profile, seen)
        seen.update(src for src, _ in examples)
        write_split(out / task, split, examples)


def parse_sizes(text: str) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for item in text.split(","):
        split, _, count = item.partition("=")
        if split not in SPLITS or not count.isdigit() or int(count) < 1:
            raise SystemExit(f"--split_sizes: expected items like train=100 with a split in {SPLITS}, got {item!r}")
        sizes[split] = int(count)
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=TASKS + ("all",), default="all")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="writes OUT/<task>/{split}.{source,target}")
    parser.add_argument("--split_sizes", type=parse_sizes, default=None,
                        help="e.g. train=1000,val=50,test=97 (default: the committed sizes)")
    parser.add_argument("--bench", type=int, default=None, metavar="N",
                        help="write only a test split of N examples from another seed, with a wider length spread")
    args = parser.parse_args(argv)
    tasks = TASKS if args.task == "all" else (args.task,)
    for task in tasks:
        if args.bench is not None:
            if args.bench < 1:
                raise SystemExit(f"--bench must be >= 1, got {args.bench}")
            generate_task(task, {"test": args.bench}, args.out, BENCH_SEED, "wide")
        else:
            generate_task(task, args.split_sizes or DEFAULT_SIZES[task], args.out, SEED, "default")
        print(f"wrote {args.out / task}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
