"""ArchRAG index stages: entity attributes, the attributed-community hierarchy (Algorithm 1, with a
summary per community), and the C-HNSW index (§3.1.3). The knowledge graph itself comes from
:mod:`tasks.methods.archrag.kg_stages`; the equations live in :mod:`tasks.methods.archrag.algorithm`.

Summaries are content-addressed: a community's summary is keyed by the summariser's identity and the
exact text it is given (its members and relations, or its children's summaries), in a row cache shared by
every run, so an unchanged community is never summarised twice (what ``flows.commands.update`` relies on).
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import scipy.sparse as sp

from tasks.core.code_identity import code_version
from tasks.core.hashing import short_hash
from tasks.core.stage import RunContext, StageParams, from_config, input_fps, run_stage, stage
from tasks.core.store import ArtifactRef, Store
from tasks.core.vectors import arrow_to_embeddings
from tasks.graph.sparse import group_positions
from tasks.llm.client import ledger_rows
from tasks.llm.ledger import estimate_text_tokens
from tasks.llm.params import LLMDryRun, LLMParams, LLMReplyParams, Messages, llm_identity
from tasks.llm.summarize import summariser_params
from tasks.methods.archrag import algorithm as alg
from tasks.methods.archrag.chnsw import CHNSW, CHNSWParams
from tasks.text.chunk import CHUNK_UNITS, ChunkParams
from tasks.text.embed import StoredEncoderParams, cached_encode, embeddings_to_arrow, load_embeddings
from tasks.core.limits import COUNT, COUNT0, POSITIVE, PROB, one_of
from tasks.graph.knn import SEARCHES
from tasks.methods.archrag.algorithm import CLUSTERINGS, EDGE_WEIGHTS

log = logging.getLogger("dagrag.archrag")

SUMMARISERS = ("auto", "extractive", "llm")
GENERATIONS = ("filter", "direct")
RELATION_SCOPES = ("among", "incident")
PASSAGE_RULES = ("auto", "entity_rank", "similarity_sum", "source_relevance")  # ArchParams.passage_rule (the retriever's module doc)
REPORT_STAGE = "archrag_report"  # LLM ledger stage of the community reports
TEXT_EMB = "archrag_text_emb"  # row cache of community-text embeddings, by content


@dataclass(frozen=True)
class ArchParams:
    """``method=archrag``: every knob of §3 / App. B.2 with the paper's (else the authors' code's) default."""

    name: str = "archrag"
    # passages ranked per query (the harness's recall@k rule, see retriever)
    top_k: int = field(default=10, metadata=COUNT)
    # ArchRAG returns no passages (§3.2.1). entity_rank: the passages of the retrieved entities, in the order of
    # their rank (a principle fixed before it was measured) | similarity_sum: the earlier rule, kept for comparison |
    # source_relevance (beyond the paper, #58): the passages every retrieved item was made from, by cosine to the
    # question | auto: source_relevance where documents are cut into several passages, else entity_rank
    passage_rule: str = "auto"
    # from the authors' code: passages of a separate dense index added (0 in their query.sh)
    topk_chunk: int = field(default=0, metadata=COUNT0)
    # §3.1.1 chunks (code: GraphRAG's 600-token windows with 100 overlap; whitespace tokens here)
    chunk_unit: str = field(default="window", metadata=one_of(CHUNK_UNITS))
    window_tokens: int = field(default=600, metadata=COUNT)
    overlap_tokens: int = field(default=100, metadata=COUNT0)
    # §3.1.2 Algorithm 1 (ClusterParams)
    augment: bool = True
    k_scale: float = field(default=1.0, metadata=COUNT0)
    percentile: float = field(default=0.8, metadata=PROB)
    edge_weight: str = field(default="cos", metadata=one_of(EDGE_WEIGHTS))
    attribute_weights: bool = True
    clustering: str = field(default="leiden", metadata=one_of(CLUSTERINGS))
    max_cluster_size: int = field(default=15, metadata=COUNT)
    resolution: float = field(default=1.0, metadata=POSITIVE)
    min_clusters: int = field(default=10, metadata=COUNT)
    max_level: int = field(default=6, metadata=COUNT0)
    seed: int = 0
    # line 3's kNN: exact (paper) | ivf | auto (beyond the paper; exact up to knn_exact_max nodes)
    knn_search: str = field(default="exact", metadata=one_of(SEARCHES))
    knn_exact_max: int = field(default=50_000, metadata=COUNT)
    ivf_nlist: int = field(default=0, metadata=COUNT0)  # knn_search=ivf: k-means cells (0: sqrt(n))
    ivf_nprobe: int = field(default=8, metadata=COUNT)  # knn_search=ivf: cells searched per node
    # community summaries (Alg. 1 line 7)
    # auto: llm when an LLM is configured, else extractive (recorded, never silent)
    summariser: str = field(default="auto", metadata=one_of(SUMMARISERS))
    summary_tokens: int = field(default=100, metadata=COUNT)  # extractive: whitespace tokens of a summary
    # code: members + relations packed to 4,000 tokens per report
    report_input_tokens: int = field(default=4000, metadata=COUNT)
    report_max_tokens: int = field(default=1500, metadata=COUNT)  # completion budget of one JSON report
    # §3.1.3 C-HNSW (App. B.3: M 32, ef 100/100)
    hnsw_m: int = field(default=32, metadata=COUNT)
    ef_construction: int = field(default=100, metadata=COUNT)
    ef_search: int = field(default=100, metadata=COUNT)
    exact_search: bool = False  # brute force per layer instead of the graphs (tests, checks)
    # §3.2.1 hierarchical search (§4.1: k = 5 per layer; every layer searched)
    # one k for all layers, or one per layer (0 = entities first)
    k_per_layer: tuple[int, ...] = field(default=(5,), metadata=COUNT0)
    entity_only: bool = False  # Table 4 "Entity-Only": search and use entities only
    # §3.2.1: relations among the retrieved entities | incident: touching one
    relation_scope: str = field(default="among", metadata=one_of(RELATION_SCOPES))
    max_relations: int = field(default=10, metadata=COUNT0)  # code's topk_e: relations given with layer 0
    # §3.2.2 adaptive filtering-based generation (eqs. 3–4)
    generation: str = field(default="filter", metadata=one_of(GENERATIONS))  # filter | direct (Table 4 "Direct Prompt")
    filter_budget_tokens: int = field(default=4000, metadata=COUNT)
    merge_budget_tokens: int = field(default=4000, metadata=COUNT)
    filter_max_tokens: int = field(default=1000, metadata=COUNT)
    answer_max_tokens: int = field(default=512, metadata=COUNT)

    def __post_init__(self) -> None:
        # summariser, generation and relation_scope: their one_of metadata (the config check)
        if self.passage_rule not in PASSAGE_RULES:
            raise ValueError(f"method.passage_rule must be one of {PASSAGE_RULES}, got {self.passage_rule!r}")
        if isinstance(self.k_per_layer, int):
            object.__setattr__(self, "k_per_layer", (self.k_per_layer,))
        if not self.k_per_layer or min(self.k_per_layer) < 0:
            raise ValueError("method.k_per_layer must be one or more non-negative ints")
        self.clustering_params()  # validates Algorithm 1's knobs
        ChunkParams(unit=self.chunk_unit, window_tokens=self.window_tokens, overlap_tokens=self.overlap_tokens)

    def clustering_params(self) -> alg.ClusterParams:
        names = {f.name for f in fields(alg.ClusterParams)}
        return alg.ClusterParams(**{k: v for k, v in asdict(self).items() if k in names})

    def k_of_layer(self, layer: int) -> int:
        """k of one layer: the last given k repeats upwards."""
        return self.k_per_layer[min(layer, len(self.k_per_layer) - 1)]


# ---------------------------------------------------------------- entity attributes


def entity_text(name: str, description: str) -> str:
    """Layer-0 attribute text (code: name + " " + description)."""
    return f"{name} {description}".strip()


@dataclass(frozen=True)
class EntityAttributeTextsParams(StageParams):
    """None: an entity's attribute text is its name and description."""


@stage("archrag_entity_texts", params=EntityAttributeTextsParams)
def entity_texts_stage(ctx: RunContext, params: EntityAttributeTextsParams, entities: ArtifactRef
                       ) -> dict[str, ArtifactRef]:
    """Stage: ``entity_texts(entity_id, text)`` in entity-id order, the shared embed stage's input."""
    def compute() -> tuple[dict[str, pd.DataFrame], int]:
        e = Store.read(entities, ["entity_id", "name", "description"]).sort_values("entity_id")
        texts = [entity_text(n, d) for n, d in zip(e["name"].tolist(), e["description"].tolist())]
        return {"entity_texts": pd.DataFrame({"entity_id": e["entity_id"].astype(str), "text": texts})}, len(e)

    return run_stage(ctx, params, input_fps(entities=entities), compute)


# ---------------------------------------------------------------- community summaries


def relation_matrix(relations: pd.DataFrame, n: int) -> sp.csr_array:
    """Symmetric entities x entities matrix of relation weights (mention counts)."""
    h, t = relations["head"].to_numpy(np.int64), relations["tail"].to_numpy(np.int64)
    w = relations["weight"].to_numpy(np.float64)
    return alg.symmetric_pattern(sp.csr_array((w, (h, t)), shape=(n, n)))


def pack_lines(lines: list[str], budget_tokens: int) -> list[str]:
    """Lines in order while they fit ``budget_tokens`` (estimated); the first is cut to fit if alone too long."""
    out, used = [], 0
    for line in lines:
        cost = estimate_text_tokens(line)
        if used + cost > budget_tokens:
            if not out and budget_tokens > 0:
                out.append(line[: budget_tokens * 4])
            break
        out.append(line)
        used += cost
    return out


@dataclass(frozen=True)
class Community:
    """What one community's summary is made from: its lines (members, relations, children) and a title hint."""

    layer: int
    index: int
    lines: tuple[str, ...]
    line_emb: np.ndarray  # embeddings of the lines the extractive summariser may pick from
    n_extractive: int  # the first n_extractive lines have embeddings (members or children)
    title_hint: str


REPORT_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["title", "summary", "rating", "findings"],
    "properties": {"title": {"type": "string"}, "summary": {"type": "string"}, "rating": {"type": "number"},
                   "findings": {"type": "array", "items": {"type": "object", "required": ["summary"],
                                                           "properties": {"summary": {"type": "string"},
                                                                          "explanation": {"type": "string"}}}}}}


def report_messages(lines: tuple[str, ...]) -> Messages:
    """Alg. 1 line 7 with an LLM: a JSON report (title, summary, 0–10 rating, findings) of one community."""
    system = ("You write short reports about groups of related entities from a knowledge graph, for a retrieval "
              "system. Use only the facts given. Reply with JSON only: {\"title\": a short name for the group "
              "naming its key entities, \"summary\": a few sentences on how the entities relate and what matters "
              "about them, \"rating\": a number from 0 to 10 for how important the group is, \"findings\": a list "
              "of 3 to 8 objects {\"summary\": one key fact, \"explanation\": a sentence of support}}.")
    return [{"role": "system", "content": system}, {"role": "user", "content": "Group data:\n" + "\n".join(lines)}]


def report_text(title: str, summary: str, findings: list[str]) -> str:
    """The text the filter prompt sees for a community (title, summary, findings)."""
    body = f"{title}: {summary}".strip()
    return body + ("".join(f"\n- {f}" for f in findings) if findings else "")


def summary_key(c: Community) -> str:
    """A community summary's row-cache key: everything it is made from. The extractive summary ranks the first
    ``n_extractive`` lines by their embeddings' closeness to the centroid, so the embeddings and that count are
    part of it, not only the lines and title (keyed by those alone, a store that lived through another encoder or
    another entity text kept the summaries it made then: a fresh store disagreed with it)."""
    emb = hashlib.blake2b(np.ascontiguousarray(c.line_emb, dtype=np.float32).tobytes(), digest_size=16).hexdigest()
    return short_hash({"lines": c.lines, "title": c.title_hint, "n_extractive": c.n_extractive, "line_emb": emb})


class Summaries:
    """Alg. 1 line 7 with a content-addressed cache: one summary per community, extractive or an LLM report."""

    def __init__(self, ctx: RunContext, params: "ExtractiveHierarchyParams | LLMHierarchyParams", kind: str,
                 llm: Optional[LLMParams]) -> None:
        self.ctx, self.params, self.kind, self.embedder = ctx, params, kind, params.encoder()
        self.client = None
        if kind == "llm":
            from pathlib import Path

            from tasks.llm.client import make_client
            self.client = make_client(llm, Path(ctx.artifacts_dir) / "llm_cache.duckdb")
        # the code that makes a summary: the LLM's prompt and report text, and (this class, hashed whole) the
        # extractive summary, also an invalid report's fallback (until 2026-11-28 only the first two were here)
        identity: dict[str, Any] = {"kind": kind, "code": code_version(report_messages, report_text, Summaries)}
        if kind == "llm":
            identity.update(llm=llm_identity(params), max_tokens=params.report_max_tokens)
        else:
            identity.update(tokens=params.summary_tokens)
        self.cache = ctx.store.row_cache("archrag_summary", short_hash(identity), "key")
        self.summarised = 0
        self.total = 0
        self.failures = 0
        self.estimate = {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0}

    def __call__(self, communities: list[Community]) -> pd.DataFrame:
        """title, summary, report, rating, source per community (cached by content), in order."""
        keys = [summary_key(c) for c in communities]
        self.total += len(keys)
        wanted = list(dict.fromkeys(keys))
        missing = set(self.cache.missing(wanted))
        todo = list({k: c for c, k in zip(communities, keys) if k in missing}.items())
        if todo:
            self.summarised += len(todo)
            frame = self._compute([c for _, c in todo])
            frame.insert(0, "key", [k for k, _ in todo])
            if not (self.ctx.llm_dry_run and self.client is not None):  # stand-ins are never cached
                self.cache.append(frame)
            else:
                return self._dry(communities, keys, frame, dict(todo))
        rows = self.cache.read(wanted).to_pandas().drop_duplicates("key").set_index("key")
        return rows.loc[keys].reset_index(drop=True)

    def _dry(self, communities, keys, frame, todo) -> pd.DataFrame:
        cached = [k for k in dict.fromkeys(keys) if k not in todo]
        rows = frame.set_index("key")
        if cached:
            rows = pd.concat([rows, self.cache.read(cached).to_pandas().set_index("key")])
        return rows.loc[keys].reset_index(drop=True)

    def _compute(self, todo: list[Community]) -> pd.DataFrame:
        extractive = self._extractive(todo)
        if self.client is None:
            return extractive
        msgs = [report_messages(c.lines) for c in todo]
        if self.ctx.llm_dry_run:
            for k, v in self.client.dry_run_estimate(msgs, self.params.report_max_tokens,
                                                     max_tokens=self.params.report_max_tokens).items():
                self.estimate[k] += v
            return extractive
        replies = self.client.chat_json(msgs, REPORT_SCHEMA, stage=REPORT_STAGE,
                                        max_tokens=self.params.report_max_tokens)
        rows = []
        for reply, fallback in zip(replies, extractive.to_dict("records")):
            if reply is None:  # invalid after one repair: counted, logged, and the row says so
                self.failures += 1
                rows.append({**fallback, "source": "extractive_after_invalid_report"})
                continue
            findings = [f.get("summary", "") for f in reply.get("findings") or [] if isinstance(f, dict)]
            title, summary = str(reply["title"]).strip(), str(reply["summary"]).strip()
            rows.append({"title": title, "summary": summary, "report": report_text(title, summary, findings),
                         "rating": float(np.clip(reply["rating"], 0, 10)), "source": "llm"})
        if self.failures:
            log.warning("archrag: %d community reports invalid after repair (extractive summaries kept for them)",
                        self.failures)
        return pd.DataFrame(rows, columns=["title", "summary", "report", "rating", "source"])

    def _extractive(self, todo: list[Community]) -> pd.DataFrame:
        from tasks.llm.summarize import extractive_summary

        rows = []
        for c in todo:
            summary = extractive_summary(c.lines[:c.n_extractive], c.line_emb, self.params.summary_tokens)
            rows.append({"title": c.title_hint, "summary": summary, "report": f"{c.title_hint}: {summary}",
                         "rating": float("nan"), "source": "extractive"})
        return pd.DataFrame(rows, columns=["title", "summary", "report", "rating", "source"])

    def embed(self, frame: pd.DataFrame) -> np.ndarray:
        """Community attributes: the embedding of title + summary (code: community text = title + summary)."""
        texts = [f"{t}\n{s}" for t, s in zip(frame["title"].tolist(), frame["summary"].tolist())]
        return alg_unit(cached_encode(self.ctx.store, texts, self.embedder, TEXT_EMB))


def alg_unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


class CommunityInputs:
    """Builds each new community's lines (Alg. 1 line 7's input) from the KG and the layer below."""

    def __init__(self, entities: pd.DataFrame, relations: pd.DataFrame, entity_emb: np.ndarray,
                 budget_tokens: int) -> None:
        self.names = entities["name"].astype(str).to_numpy(dtype=object)
        kinds = entities["type"].astype(str).to_numpy(dtype=object)
        descs = entities["description"].astype(str).to_numpy(dtype=object)
        self.entity_lines = np.array([f"{n} ({k}): {d}" if d else f"{n} ({k})"
                                      for n, k, d in zip(self.names, kinds, descs)], dtype=object)
        n = len(self.names)
        self.degree = np.diff(relation_matrix(relations, n).indptr)
        self.rel_head = relations["head"].to_numpy(np.int64)
        self.rel_tail = relations["tail"].to_numpy(np.int64)
        self.rel_rank = -(self.degree[self.rel_head] + self.degree[self.rel_tail])  # busiest relations first
        self.rel_lines = np.array([f"{self.names[h]} -- {self.names[t]}: {d}" if d else f"{self.names[h]} -- "
                                   f"{self.names[t]}" for h, t, d in zip(self.rel_head, self.rel_tail,
                                                                           relations["description"])],
                                  dtype=object)
        self.entity_emb, self.budget = entity_emb, budget_tokens
        self.layers: list[pd.DataFrame] = []  # summaries of each community layer, filled as layers are built
        self.layer_emb: list[np.ndarray] = [entity_emb]
        self.parents: list[np.ndarray] = []  # labels of each layer built so far

    def communities(self, level: int, labels: np.ndarray) -> list[Community]:
        """Level ``level``'s communities, given the labels of the layer below."""
        below = self.layer_emb[level - 1]
        n_comm = int(labels.max()) + 1
        members = group_positions(labels, n_comm)
        entity_comm = labels[self._entity_to_node(level - 1)]  # entity -> its community at this level
        rel_comm = entity_comm[self.rel_head]
        inside = np.flatnonzero(rel_comm == entity_comm[self.rel_tail])
        rel_by_comm = [inside[g] for g in group_positions(rel_comm[inside], n_comm)]
        ent_by_comm = group_positions(entity_comm, n_comm)
        if level > 1:  # the layer below's columns, once (not per community)
            prev = self.layers[level - 2]
            size_below = prev["n_entities"].to_numpy()
            titles, summaries = prev["title"].to_numpy(dtype=object), prev["summary"].to_numpy(dtype=object)
        out = []
        for c in range(n_comm):
            ents = ent_by_comm[c]
            ents = ents[np.argsort(-self.degree[ents], kind="stable")]
            rels = rel_by_comm[c]
            rels = rels[np.argsort(self.rel_rank[rels], kind="stable")]
            kids = members[c]
            if level == 1:
                order = kids[np.argsort(-self.degree[kids], kind="stable")]
                head = list(self.entity_lines[order])
                head_emb = self.entity_emb[order]
                title = ", ".join(self.names[ents[:3]])
                rest = list(self.rel_lines[rels])
            else:  # code: the children's reports first, then the member entities and their relations
                order = kids[np.argsort(-size_below[kids], kind="stable")]
                head = [f"{t}: {s}" for t, s in zip(titles[order], summaries[order])]
                head_emb = below[order]
                title = "; ".join(titles[order[:3]])
                rest = list(self.entity_lines[ents]) + list(self.rel_lines[rels])
            lines = pack_lines(head + rest, self.budget)
            n_ex = min(len(head), len(lines))
            out.append(Community(level, c, tuple(lines), head_emb[:n_ex], n_ex, title))
        return out

    def _entity_to_node(self, layer: int) -> np.ndarray:
        """For each entity, its node in ``layer``."""
        node = np.arange(len(self.names))
        for parent in self.parents[:layer]:
            node = parent[node]
        return node

    def add_layer(self, labels: np.ndarray, frame: pd.DataFrame, emb: np.ndarray) -> None:
        entity_comm = labels[self._entity_to_node(len(self.parents))]
        self.parents.append(labels)
        self.layers.append(frame.assign(n_entities=np.bincount(entity_comm, minlength=len(frame))))
        self.layer_emb.append(emb)


# ---------------------------------------------------------------- the hierarchy stage


@dataclass(frozen=True)
class HierarchyParams(StoredEncoderParams):
    """Algorithm 1 (:class:`tasks.methods.archrag.algorithm.ClusterParams`), what a summary is made from (line 7)
    and the encoder of the community attributes (the entities' own); its two variants add their summariser's
    settings."""

    SOURCES = ("method",)
    augment: bool
    k_scale: float
    percentile: float
    edge_weight: str
    attribute_weights: bool
    clustering: str
    max_cluster_size: int
    resolution: float
    min_clusters: int
    max_level: int
    seed: int
    knn_search: str
    knn_exact_max: int
    ivf_nlist: int
    ivf_nprobe: int
    report_input_tokens: int
    summary_tokens: int  # the extractive summary (with an LLM: of a report that stays invalid)

    def clustering_params(self) -> alg.ClusterParams:
        """The knobs :func:`tasks.methods.archrag.algorithm.hierarchical_clustering` takes."""
        return alg.ClusterParams(**{f.name: getattr(self, f.name) for f in fields(alg.ClusterParams)})


@dataclass(frozen=True)
class ExtractiveHierarchyParams(HierarchyParams):
    """``archrag_hierarchy`` with extractive summaries: no LLM setting is read."""

    kind: ClassVar[str] = "extractive"


@dataclass(frozen=True)
class LLMHierarchyParams(HierarchyParams, LLMReplyParams):
    """``archrag_hierarchy`` with the LLM's community reports: their budget, and what in the ``llm`` group changes
    a report (never the endpoint or key)."""

    kind: ClassVar[str] = "llm"
    report_max_tokens: int = from_config("report_max_tokens")


def hierarchy_params(cfg: Any) -> ExtractiveHierarchyParams | LLMHierarchyParams:
    """The hierarchy stage's params of the summariser ``method.summariser`` resolves to."""
    return summariser_params(cfg, ExtractiveHierarchyParams, LLMHierarchyParams)


def hierarchy_tables(h: alg.Hierarchy, inputs: CommunityInputs) -> dict[str, Any]:
    """The stored form of a hierarchy: communities, parent links and community embeddings."""
    comm = [f.assign(layer=l + 1, community=np.arange(len(f))) for l, f in enumerate(inputs.layers)]
    communities = (pd.concat(comm, ignore_index=True) if comm else
                   pd.DataFrame(columns=["title", "summary", "report", "rating", "source", "n_entities", "layer",
                                         "community"]))
    communities = communities[["layer", "community", "title", "summary", "report", "rating", "source",
                               "n_entities"]].astype({"layer": "int64", "community": "int64", "n_entities": "int64",
                                                      "rating": "float64"})
    parents = pd.DataFrame({"layer": np.concatenate([np.full(p.size, l, np.int64) for l, p in enumerate(h.parent)]
                                                    or [np.zeros(0, np.int64)]),
                            "node": np.concatenate([np.arange(p.size) for p in h.parent] or [np.zeros(0, np.int64)]),
                            "parent": np.concatenate(h.parent or [np.zeros(0, np.int64)])}).astype("int64")
    emb = np.concatenate(h.embeddings[1:]) if h.n_layers > 1 else np.zeros((0, h.embeddings[0].shape[1]), np.float32)
    emb_table = pa.table({"layer": communities["layer"].to_numpy(), "community": communities["community"].to_numpy(),
                          "emb": embeddings_to_arrow(emb)})
    return {"communities": communities, "parents": parents, "community_embeddings": emb_table}


@stage("archrag_hierarchy", params=(ExtractiveHierarchyParams, LLMHierarchyParams))
def hierarchy_stage(ctx: RunContext, params: ExtractiveHierarchyParams | LLMHierarchyParams, entities: ArtifactRef,
                    relations: ArtifactRef, entity_embeddings: ArtifactRef, kg_meta: ArtifactRef,
                    llm: Optional[LLMParams]) -> dict[str, ArtifactRef]:
    """Stage: Algorithm 1 over the KG, a summary per community (cached by content), its meta row. ``llm`` is
    the service the report writer calls (what in it changes a report is in ``params``)."""
    kind = params.kind

    def compute() -> tuple[dict[str, Any], int]:
        ent = Store.read(entities).sort_values("entity_id").reset_index(drop=True)
        rel = Store.read(relations)
        _, emb = load_embeddings(entity_embeddings, "entity_id")
        emb = alg_unit(emb)
        inputs = CommunityInputs(ent, rel, emb, params.report_input_tokens)
        summaries = Summaries(ctx, params, kind, llm)

        def summarise(level: int, labels: np.ndarray) -> np.ndarray:
            log.info("archrag layer %d: %d nodes clustered into %d communities, summarising them", level,
                     labels.size, int(labels.max()) + 1)
            frame = summaries(inputs.communities(level, labels))
            out = summaries.embed(frame)
            inputs.add_layer(labels, frame, out)
            return out

        with ledger_rows(ctx.store, ctx.run_id, summaries.client, REPORT_STAGE):
            h = alg.hierarchical_clustering(relation_matrix(rel, len(ent)), emb, params.clustering_params(), summarise)
            if summaries.client is not None and ctx.llm_dry_run:
                raise LLMDryRun(REPORT_STAGE, summaries.estimate)
            tables = hierarchy_tables(h, inputs)
            builder = Store.read(kg_meta)["builder"].iloc[0]
            meta = {"kg_builder": builder, "summariser": kind, "layers": h.n_layers, "stop_reason": h.stop_reason,
                    "communities": int(len(tables["communities"])), "summaries_computed": summaries.summarised,
                    "summaries_total": summaries.total, "report_failures": summaries.failures,
                    "per_layer": json.dumps(h.stats)}
            if summaries.client is not None:
                ledger = summaries.client.ledger_summary(REPORT_STAGE)
                meta.update(report_calls=int(ledger.get("llm_calls", 0)), report_cache_hits=int(ledger.get("llm_cache_hits", 0)))
            log.info("archrag hierarchy (%s KG, %s summaries): %d layers, %d communities, %d of %d summaries computed; %s",
                     builder, kind, h.n_layers, meta["communities"], summaries.summarised, summaries.total, h.stop_reason)
            return {**tables, "hierarchy_meta": pd.DataFrame([meta])}, int(len(tables["communities"]))

    return run_stage(ctx, params, input_fps(entities=entities, relations=relations, embeddings=entity_embeddings),
                     compute)


# ---------------------------------------------------------------- C-HNSW


def layer_vectors(entity_embeddings: ArtifactRef, community_embeddings: ArtifactRef) -> list[np.ndarray]:
    """C-HNSW's layers: entity attributes, then each community layer's (in community order)."""
    _, ent = load_embeddings(entity_embeddings, "entity_id")
    table = Store.read_arrow(community_embeddings)
    emb = arrow_to_embeddings(table.column("emb")) if table.num_rows else np.zeros((0, ent.shape[1]), np.float32)
    layer = np.asarray(table.column("layer").to_pylist(), dtype=np.int64)
    return [alg_unit(ent)] + [alg_unit(emb[layer == l]) for l in range(1, int(layer.max(initial=0)) + 1)]


@dataclass(frozen=True)
class CHNSWBuildParams(StageParams):
    """The C-HNSW index (App. B.3: M 32, ef 100/100): ``ef_search`` and ``exact`` are stored in it and the
    retriever searches with them, so they are its params too (``exact`` also builds flat layers)."""

    SOURCES = ("method",)
    M: int = from_config("hnsw_m")
    ef_construction: int = 100
    ef_search: int = 100
    exact: bool = from_config("exact_search", False)

    def chnsw(self) -> CHNSWParams:
        return CHNSWParams(M=self.M, ef_construction=self.ef_construction, ef_search=self.ef_search, exact=self.exact)


@stage("archrag_chnsw", params=CHNSWBuildParams)
def chnsw_stage(ctx: RunContext, params: CHNSWBuildParams, entity_embeddings: ArtifactRef,
                community_embeddings: ArtifactRef) -> dict[str, ArtifactRef]:
    """Stage: the C-HNSW index over entities and every community layer (§3.1.3), stored as one file."""
    def compute() -> tuple[dict[str, bytes], int]:
        layers = layer_vectors(entity_embeddings, community_embeddings)
        index = CHNSW.build(layers, params.chnsw())
        return {"chnsw": index.to_bytes()}, sum(x.shape[0] for x in layers)

    return run_stage(ctx, params, input_fps(entities=entity_embeddings, communities=community_embeddings), compute,
                     ext={"chnsw": "bin"})


# ---------------------------------------------------------------- flows.commands.update


def update_summary(store: Store, run_id: str, dataset: str, index: dict[str, ArtifactRef]) -> dict[str, Any]:
    """What an ArchRAG update did: chunks extracted anew (row stages), whether the communities were
    recomputed, and how many community summaries had to be made (the rest came from the content cache)."""
    ev = store.events(run_id)
    meta = Store.read(index["hierarchy_meta"]).iloc[0].to_dict()
    hier = ev[ev["stage"] == "archrag_hierarchy"]
    recomputed = bool((hier["status"] == "computed").any())
    rows = ev[ev["status"] == "computed"].groupby("stage")["rows_computed"].sum().astype(int).to_dict()
    return {"kg_builder": meta["kg_builder"], "summariser": meta["summariser"],
            "communities_recomputed": recomputed, "layers": int(meta["layers"]),
            "segments_total": int(meta["communities"]),
            "segments_resummarized": int(meta["summaries_computed"]) if recomputed else 0,
            "rows_computed_by_stage": rows,
            "per_layer": [{k: s[k] for k in ("level", "nodes_below", "communities", "max_size", "chi", "sim")}
                          for s in json.loads(meta["per_layer"])]}
