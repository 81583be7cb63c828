"""Write the embedded default's corpus sample: orchestrator/sample_data/corpus/{in_domain,general}.txt.

    python scripts/make_sample_corpus.py                 # rewrite the shipped files
    python scripts/make_sample_corpus.py --out /tmp/c    # elsewhere (tests compare the bytes)

Why generated, not copied: the real corpora under ../shared/data may not be redistributed, and
a fresh clone must run the whole chain on its own. The text is synthetic but shaped like the
real thing, so the chain's stages have something to learn:

* in_domain.txt: one biomedical-looking abstract per line (~100 KB). Each abstract follows
  background -> objective -> methods -> results -> conclusion and keeps the same disease, drug,
  gene and cell type throughout, so a real next sentence shares entities with its predecessor
  and a random one mostly does not (NSP has a signal). Drug names are built from stems and
  pharmacological suffixes (-tinib, -mab, -vir ...), so WordPiece finds domain subwords.
* general.txt: one general-English paragraph per line (~300 KB) on everyday topics, each
  paragraph following one person through one place and activity.

Deterministic: a fixed seed and no dependence on dict/set ordering; the same bytes every run.
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "orchestrator" / "sample_data" / "corpus"
SEED = 20261122

# ---------------------------------------------------------------------------------------------
# Biomedical word lists (common terms and public gene symbols; drug names are invented)
DISEASES = [
    "type 2 diabetes", "rheumatoid arthritis", "chronic kidney disease", "hepatocellular carcinoma",
    "non-small cell lung cancer", "Alzheimer's disease", "Parkinson's disease", "multiple sclerosis",
    "ulcerative colitis", "Crohn's disease", "asthma", "chronic obstructive pulmonary disease",
    "heart failure", "atrial fibrillation", "systemic lupus erythematosus", "psoriasis",
    "acute myeloid leukemia", "glioblastoma", "pancreatic adenocarcinoma", "colorectal cancer",
    "breast cancer", "prostate cancer", "sepsis", "tuberculosis", "influenza", "hepatitis B",
    "osteoarthritis", "osteoporosis", "major depressive disorder", "schizophrenia", "epilepsy",
    "migraine", "hypertension", "atherosclerosis", "nonalcoholic steatohepatitis", "cystic fibrosis",
    "sickle cell disease", "idiopathic pulmonary fibrosis", "melanoma", "ovarian cancer",
]
DRUG_STEMS = ["ala", "beri", "cana", "dora", "eli", "fosa", "gali", "hexa", "ibru", "joma", "kara", "lora",
              "mira", "nexa", "obi", "pemi", "quila", "rosu", "sema", "tali", "umbra", "vela", "zanu", "tofa",
              "bari", "dapa", "empa", "ertu", "lena", "poma", "ruxo", "seli", "vori", "cabo", "nira", "olapa"]
DRUG_SUFFIXES = ["tinib", "ciclib", "mab", "zumab", "ximab", "vir", "previr", "gliflozin", "gliptin", "statin",
                 "sartan", "pril", "olol", "parin", "xaban", "lukast", "setron", "prazole", "dronate",
                 "fenib", "lisib", "rafenib", "parib", "tecan"]
GENES = ["TP53", "BRCA1", "BRCA2", "EGFR", "KRAS", "BRAF", "PIK3CA", "PTEN", "MYC", "ERBB2", "ALK", "JAK2",
         "STAT3", "NFKB1", "TNF", "IL6", "IL1B", "IL17A", "TGFB1", "VEGFA", "HIF1A", "MTOR", "AKT1", "CDK4",
         "CDKN2A", "APOE", "APP", "MAPT", "SNCA", "LRRK2", "CFTR", "HBB", "INS", "PPARG", "SIRT1", "FOXO3",
         "NRF2", "KEAP1", "PDCD1", "CD274", "CTLA4", "FOXP3", "GATA3", "TLR4", "NLRP3", "CASP3", "BCL2",
         "BAX", "MDM2", "ATM", "ESR1", "AR", "ACE2", "SOD1", "GAPDH", "ACTB", "MMP9", "CXCL8", "CCL2"]
CELLS = ["CD4+ T cells", "CD8+ T cells", "regulatory T cells", "B cells", "natural killer cells", "macrophages",
         "dendritic cells", "neutrophils", "hepatocytes", "cardiomyocytes", "podocytes", "astrocytes",
         "microglia", "dopaminergic neurons", "keratinocytes", "fibroblasts", "endothelial cells",
         "pancreatic beta cells", "osteoblasts", "chondrocytes", "alveolar epithelial cells",
         "intestinal epithelial cells", "mesenchymal stem cells", "induced pluripotent stem cells"]
TISSUES = ["liver", "kidney", "lung", "colon", "brain", "hippocampus", "skeletal muscle", "adipose tissue",
           "bone marrow", "spleen", "skin", "synovium", "retina", "pancreas", "heart", "peripheral blood"]
MODELS = ["a murine model", "knockout mice", "a xenograft model", "a zebrafish model", "a rat model",
          "patient-derived organoids", "primary human cultures", "a prospective cohort", "a retrospective cohort",
          "a randomized controlled trial", "a case-control study", "a cross-sectional study"]
ASSAYS = ["quantitative PCR", "western blotting", "flow cytometry", "immunohistochemistry", "RNA sequencing",
          "single-cell RNA sequencing", "chromatin immunoprecipitation", "mass spectrometry", "ELISA",
          "whole-exome sequencing", "confocal microscopy", "CRISPR-Cas9 screening", "luciferase reporter assays"]
MARKERS = ["serum creatinine", "glycated hemoglobin", "C-reactive protein", "interleukin-6", "tumor necrosis factor",
           "lactate dehydrogenase", "alanine aminotransferase", "troponin I", "brain natriuretic peptide",
           "fasting glucose", "low-density lipoprotein cholesterol", "amyloid beta", "phosphorylated tau",
           "reactive oxygen species", "malondialdehyde", "Ki-67 expression", "caspase-3 activity"]
OUTCOMES = ["overall survival", "progression-free survival", "disease activity", "hospital readmission",
            "all-cause mortality", "symptom severity", "quality of life", "tumor volume", "relapse rate",
            "renal function", "cognitive decline", "exacerbation frequency"]
PATHWAYS = ["the PI3K/AKT/mTOR pathway", "the MAPK/ERK pathway", "NF-kappaB signaling", "the JAK/STAT pathway",
            "Wnt/beta-catenin signaling", "the Hippo pathway", "autophagy", "ferroptosis", "the unfolded protein "
            "response", "oxidative phosphorylation", "glycolysis", "the NLRP3 inflammasome", "TGF-beta signaling",
            "the Notch pathway", "apoptosis", "mitochondrial biogenesis", "epithelial-mesenchymal transition"]
ADJ_DISEASE = ["chronic", "progressive", "heterogeneous", "debilitating", "common", "life-threatening",
               "multifactorial", "inflammatory", "aggressive", "poorly understood"]
EFFECT_UP = ["increased", "enhanced", "upregulated", "elevated", "restored", "promoted"]
EFFECT_DOWN = ["reduced", "attenuated", "suppressed", "decreased", "inhibited", "downregulated"]
CONTROLS = ["placebo", "vehicle-treated controls", "the standard of care", "untreated controls",
            "wild-type littermates", "healthy volunteers", "sham-operated animals"]


def drug_name(rng: random.Random) -> str:
    return rng.choice(DRUG_STEMS) + rng.choice(["", "n", "l", "r", "x"]) + rng.choice(DRUG_SUFFIXES)


def p_value(rng: random.Random) -> str:
    return rng.choice(["p < 0.001", "p < 0.01", "p < 0.05", f"p = 0.0{rng.randint(1, 4)}{rng.randint(0, 9)}"])


def abstract(rng: random.Random) -> str:
    """One abstract; every sentence reuses the abstract's own entities (a learnable NSP signal)."""
    e = {"disease": rng.choice(DISEASES), "drug": drug_name(rng), "gene": rng.choice(GENES),
         "gene2": rng.choice(GENES), "cell": rng.choice(CELLS), "tissue": rng.choice(TISSUES),
         "model": rng.choice(MODELS), "assay": rng.choice(ASSAYS), "assay2": rng.choice(ASSAYS),
         "marker": rng.choice(MARKERS), "outcome": rng.choice(OUTCOMES), "pathway": rng.choice(PATHWAYS),
         "adj": rng.choice(ADJ_DISEASE), "up": rng.choice(EFFECT_UP), "down": rng.choice(EFFECT_DOWN),
         "control": rng.choice(CONTROLS), "n": rng.randint(24, 2400), "dose": rng.choice([0.5, 1, 2.5, 5, 10, 20, 40]),
         "weeks": rng.choice([4, 8, 12, 24, 26, 48, 52]), "pct": rng.randint(12, 68),
         "hr": f"{rng.uniform(0.42, 0.91):.2f}", "ci_lo": "", "ci_hi": "", "p": p_value(rng),
         "p2": p_value(rng), "fold": f"{rng.uniform(1.4, 6.5):.1f}", "age": rng.randint(34, 71)}
    lo = float(e["hr"]) - rng.uniform(0.05, 0.2)
    e["ci_lo"], e["ci_hi"] = f"{max(lo, 0.1):.2f}", f"{float(e['hr']) + rng.uniform(0.05, 0.2):.2f}"
    if e["gene2"] == e["gene"]:
        e["gene2"] = GENES[(GENES.index(e["gene"]) + 7) % len(GENES)]
    background = [
        "{Disease} is a {adj} disorder with limited treatment options.",
        "{Disease} remains a leading cause of morbidity and mortality worldwide.",
        "Dysregulation of {pathway} has been implicated in the pathogenesis of {disease}.",
        "{Disease} is characterized by aberrant activation of {cell} in the {tissue}.",
        "Accumulating evidence suggests that {gene} contributes to the progression of {disease}.",
    ]
    gap = [
        "However, the role of {gene} in {cell} during {disease} remains unclear.",
        "However, whether {gene} regulates {pathway} in {disease} has not been established.",
        "The mechanisms linking {gene} and {gene2} in {disease} are poorly understood.",
        "Little is known about the effect of {drug} on {cell} in {disease}.",
    ]
    objective = [
        "In this study, we investigated whether {drug} modulates {gene} expression in {cell} from patients with {disease}.",
        "We aimed to evaluate the efficacy and safety of {drug} in patients with {disease}.",
        "Here we examined the interaction between {gene} and {gene2} using {model}.",
        "This study assessed the association between {gene} variants and {outcome} in {disease}.",
    ]
    methods = [
        "We enrolled {n} patients with {disease} (mean age {age} years) and randomized them to {drug} {dose} mg daily or {control} for {weeks} weeks.",
        "{Cell} were isolated from the {tissue} and treated with {drug} at {dose} micromolar for 48 hours.",
        "Expression of {gene} and {gene2} was measured by {assay} and confirmed by {assay2}.",
        "We used {model} and analyzed the {tissue} by {assay}.",
        "The primary endpoint was {outcome}; secondary endpoints included changes in {marker}.",
        "{Gene} was silenced with small interfering RNA, and {pathway} activity was quantified by {assay}.",
    ]
    results = [
        "{Drug} {down} {marker} by {pct}% compared with {control} ({p}).",
        "{Drug} treatment {up} {gene} expression {fold}-fold in {cell} ({p}).",
        "Loss of {gene} {down} {pathway} and {up} {gene2} levels in the {tissue} ({p}).",
        "Patients receiving {drug} showed improved {outcome} (hazard ratio {hr}, 95% CI {ci_lo} to {ci_hi}; {p2}).",
        "{Gene} expression correlated with {marker} in {cell} ({p2}).",
        "Adverse events were mild and occurred at similar rates in the {drug} and {control} groups.",
    ]
    conclusion = [
        "These findings suggest that {gene} is a potential therapeutic target in {disease}.",
        "{Drug} may offer a new treatment option for patients with {disease}.",
        "Our results identify {pathway} as a mediator of {gene} function in {cell}.",
        "Targeting the {gene}-{gene2} axis may slow the progression of {disease}.",
        "Larger trials are needed to confirm the benefit of {drug} on {outcome} in {disease}.",
    ]
    parts = [rng.choice(background), rng.choice(gap), rng.choice(objective)]
    parts += rng.sample(methods, rng.randint(2, 3)) + rng.sample(results, rng.randint(2, 4)) + [rng.choice(conclusion)]
    title = rng.choice(["{Gene} regulates {pathway} in {disease}.", "Effect of {drug} on {outcome} in {disease}.",
                        "{Drug} targets {gene} in {cell}.", "Role of {gene} and {gene2} in {disease}."])
    return " ".join(_fill(s, e) for s in [title] + parts)


# ---------------------------------------------------------------------------------------------
# General English
NAMES = ["Anna", "Ben", "Clara", "David", "Elena", "Farid", "Grace", "Hugo", "Irene", "Jonas", "Keiko", "Leo",
         "Maya", "Nikolai", "Olivia", "Pablo", "Quinn", "Rosa", "Samuel", "Tara", "Umar", "Vera", "William",
         "Yusuf", "Zoe", "Martha", "Oscar", "Priya", "Tomas", "Lucia"]
PLACES = ["the old harbour", "the village market", "the city library", "a small mountain town", "the river path",
          "the railway station", "a quiet seaside cafe", "the botanical garden", "the football ground",
          "the community hall", "a crowded bus", "the school playground", "the museum of modern art",
          "the bakery on the corner", "a wooden cabin by the lake", "the night train to the coast"]
TOPICS = {
    "cooking": (["soup", "bread", "a lemon cake", "vegetable curry", "fresh pasta", "apple pie", "fish stew",
                 "pancakes", "roasted potatoes", "a tomato salad"],
                ["chopped the onions", "kneaded the dough", "measured the flour", "stirred the pot slowly",
                 "tasted the sauce", "preheated the oven", "washed the vegetables", "added a pinch of salt"],
                ["kitchen", "recipe", "oven", "spices", "dinner", "guests"]),
    "travel": (["a long journey", "a weekend trip", "a walk along the coast", "a visit to the capital",
                "a cycling tour", "a holiday in the hills"],
               ["packed a small bag", "checked the timetable", "bought a ticket", "studied the map",
                "asked a stranger for directions", "took photographs of the bridge", "missed the last ferry"],
               ["luggage", "passport", "hotel", "platform", "postcards", "souvenirs"]),
    "gardening": (["roses", "tomatoes", "a row of beans", "tulip bulbs", "herbs", "young apple trees"],
                  ["dug the soil", "pulled the weeds", "watered the seedlings", "pruned the hedge",
                   "spread compost", "built a small fence", "planted seeds in neat rows"],
                  ["garden", "spade", "greenhouse", "rain", "harvest", "neighbours"]),
    "music": (["a violin concerto", "an old folk song", "a jazz standard", "a piano sonata", "a choir piece",
               "a new song for the festival"],
              ["tuned the guitar", "practised the scales", "listened to the recording", "rehearsed with the band",
               "wrote the lyrics", "counted the rhythm aloud", "played the melody again"],
              ["concert", "audience", "rehearsal", "stage", "orchestra", "applause"]),
    "sport": (["the final match", "a marathon", "the swimming race", "a tennis tournament", "a chess game",
               "the cycling championship"],
              ["trained every morning", "stretched before the start", "studied the opponent", "ran along the track",
               "drank plenty of water", "listened to the coach", "kept a steady pace"],
              ["team", "coach", "trophy", "stadium", "supporters", "medal"]),
    "history": (["the old castle", "a forgotten treaty", "the first printing press", "the ancient road",
                 "a medieval manuscript", "the harbour's trading past"],
                ["read the archive records", "visited the ruins", "compared two old maps",
                 "interviewed the oldest resident", "copied the inscription", "searched the parish registers"],
                ["century", "king", "merchants", "walls", "archive", "legend"]),
    "weather": (["a sudden storm", "the first snow of winter", "a long dry summer", "heavy autumn rain",
                 "a foggy morning", "the spring floods"],
                ["closed the shutters", "checked the forecast", "carried an umbrella", "cleared the path",
                 "watched the clouds gather", "waited for the wind to calm"],
                ["sky", "thunder", "roads", "harvest", "river", "sunshine"]),
    "painting": (["a portrait of a fisherman", "a landscape of the valley", "a mural for the school",
                  "a still life with pears", "a watercolour of the harbour", "an abstract canvas"],
                 ["mixed the colours on a palette", "sketched the outline in charcoal", "stretched a new canvas",
                  "cleaned the brushes", "studied the light on the wall", "painted over the first attempt"],
                 ["easel", "gallery", "brushes", "sketchbook", "frame", "exhibition"]),
    "building": (["a garden shed", "a bookshelf", "a treehouse", "a new roof for the barn", "a stone wall",
                  "a wooden boat"],
                 ["measured the planks twice", "sharpened the saw", "drilled the holes", "sanded the edges",
                  "mixed the mortar", "read the instructions carefully", "carried the timber from the yard"],
                 ["hammer", "workshop", "nails", "ladder", "blueprint", "toolbox"]),
    "fishing": (["a quiet day of fishing", "the autumn fishing contest", "a trip to the northern lakes",
                 "a night on the pier"],
                ["untangled the line", "chose a bright lure", "rowed to the middle of the lake",
                 "waited patiently in the reeds", "mended the old net", "checked the tide tables"],
                ["boat", "bait", "pier", "catch", "lighthouse", "current"]),
    "shopping": (["a birthday present", "new winter boots", "furniture for the flat", "a second-hand bicycle",
                  "groceries for the week"],
                 ["compared the prices", "wrote a careful list", "visited three different shops",
                  "counted the coins in a purse", "asked the shopkeeper for a discount", "carried the bags home"],
                 ["receipt", "market", "bargain", "counter", "queue", "shelves"]),
}
SCENERY_ADJ = ["golden", "grey", "narrow", "crooked", "gentle", "bright", "silent", "noisy", "ancient", "freshly painted",
               "windswept", "crowded", "peaceful", "muddy", "sunlit", "frozen", "fragrant", "dusty", "green", "shimmering"]
SCENERY_NOUN = ["chimneys", "cobblestones", "willow trees", "fishing boats", "church bells", "shop windows",
                "hedgerows", "rooftops", "lanterns", "seagulls", "meadows", "bridges", "alleys", "orchards",
                "sailboats", "vineyards", "pine forests", "market stalls", "cathedral towers", "sand dunes"]
SCENERY_VERB = ["glowed in the evening light", "stretched towards the horizon", "creaked in the wind",
                "reflected in the water", "disappeared into the mist", "echoed across the valley",
                "crowded the narrow street", "shone after the rain", "swayed gently", "waited in the silence"]
FEMALE = {"Anna", "Clara", "Elena", "Grace", "Irene", "Keiko", "Maya", "Olivia", "Rosa", "Tara", "Vera", "Zoe",
          "Martha", "Priya", "Lucia"}


FEELINGS = ["tired but happy", "nervous", "proud", "surprised", "calm", "excited", "a little disappointed",
            "grateful", "curious", "relieved"]
DAY_WORDS = ["long", "wonderful", "exhausting", "strange", "memorable", "peaceful", "chaotic", "rewarding"]
TIMES = ["On Monday morning", "Late in the afternoon", "Early on Saturday", "After a long week", "One cold evening",
         "At the end of the summer", "Just before dawn", "During the holidays", "On a rainy Thursday"]


def paragraph(rng: random.Random) -> str:
    """One paragraph: one person, one place, one topic, told in order (coherent next sentences)."""
    topic = rng.choice(sorted(TOPICS))
    objects, actions, nouns = TOPICS[topic]
    e = {"name": rng.choice(NAMES), "friend": rng.choice(NAMES), "place": rng.choice(PLACES),
         "object": rng.choice(objects), "time": rng.choice(TIMES), "feeling": rng.choice(FEELINGS),
         "noun": rng.choice(nouns), "noun2": rng.choice(nouns), "hours": rng.choice(["two", "three", "four", "five"]),
         "topic": topic, "day": rng.choice(DAY_WORDS), "adj1": rng.choice(SCENERY_ADJ),
         "adj2": rng.choice(SCENERY_ADJ), "scene1": rng.choice(SCENERY_NOUN), "scene2": rng.choice(SCENERY_NOUN),
         "sverb": rng.choice(SCENERY_VERB)}
    if e["friend"] == e["name"]:
        e["friend"] = NAMES[(NAMES.index(e["name"]) + 3) % len(NAMES)]
    steps = rng.sample(actions, rng.randint(3, 5))
    pron = "she" if e["name"] in FEMALE else "he"
    opening = rng.choice([
        "{time}, {name} went to {place} to prepare for {object}.",
        "{time}, {name} decided that it was finally time for {object}.",
        "{name} had been thinking about {object} for weeks, and {time_lower} the day arrived.",
        "Everyone at {place} knew that {name} cared more about {topic} than anything else.",
    ])
    middle = [f"First, {e['name']} {steps[0]}."]
    middle += [rng.choice(["Then {pron} {act}.", "After that, {pron} {act}.", "Next, {pron} {act}.",
                           "Before long, {pron} {act}."]).format(pron=rng.choice([pron, e["name"]]), act=a)
               + rng.choice(["", "", f" The {rng.choice(nouns)} still needed attention.",
                             f" It was all part of the plan for {e['object']}."])
               for a in steps[1:]]
    friend = rng.choice([
        "{friend} arrived with questions about the {noun} and stayed to help.",
        "{friend} laughed and said that the {noun} reminded them of their childhood.",
        "A message from {friend} asked whether everything was ready for the {noun}.",
        "{friend}, who had more experience with the {noun}, offered some advice.",
    ])
    detail = rng.choice([
        "It took almost {hours} hours, and the {noun2} was not quite what anyone expected.",
        "The {noun2} turned out to be the hardest part of the whole day.",
        "Nobody had mentioned the {noun2}, so that part needed some improvisation.",
        "By then the {noun2} was ready, and the {noun} looked better than before.",
    ])
    closing = rng.choice([
        "In the end, {name} felt {feeling} and promised to try {object} again next year.",
        "When it was over, {name} sat down at {place}, {feeling}, and wrote everything down.",
        "{name} went home {feeling}, already planning the next attempt at {object}.",
        "Looking back, {name} said the day had been {day} from beginning to end.",
    ])
    e["time_lower"] = e["time"][0].lower() + e["time"][1:]
    scenery = rng.choice([
        "Outside, the {adj1} {scene1} {sverb}.",
        "From {place} one could see {adj1} {scene1} and {adj2} {scene2}.",
        "The {adj1} {scene1} near {place} {sverb}, and {name} stopped for a moment to look.",
    ])
    body = middle[:]
    body.insert(rng.randint(1, len(body)), scenery)
    return " ".join(_fill(s, e) for s in [opening] + body + [friend, detail, closing])


# ---------------------------------------------------------------------------------------------
def _fill(template: str, values: dict) -> str:
    """str.format with ``{Key}`` meaning the value with its first letter capitalised."""
    caps = {k[0].upper() + k[1:]: str(v)[0].upper() + str(v)[1:] for k, v in values.items()}
    return template.format(**values, **caps)


def generate(kind: str, target_bytes: int, seed: int = SEED) -> str:
    """Documents (one per line) until ``target_bytes`` is reached; identical output for one seed."""
    rng = random.Random(f"{seed}-{kind}")
    make = abstract if kind == "in_domain" else paragraph
    lines, size = [], 0
    while size < target_bytes:
        line = make(rng)
        lines.append(line)
        size += len(line.encode("utf-8")) + 1
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"output directory (default {OUT})")
    parser.add_argument("--in-domain-kb", type=int, default=100, help="size of in_domain.txt in KB")
    parser.add_argument("--general-kb", type=int, default=300, help="size of general.txt in KB")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for kind, kb in (("in_domain", args.in_domain_kb), ("general", args.general_kb)):
        path = args.out / f"{kind}.txt"
        tmp = path.with_suffix(".txt.tmp")
        text = generate(kind, kb * 1000)
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        print(f"{path}: {text.count(chr(10))} documents, {len(text.encode('utf-8'))} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
