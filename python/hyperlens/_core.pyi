# Type stubs of the extension module `hyperlens._core` (crates/py). The public API is the Python
# package around it; these functions take arrays in the dtypes the package converts to.
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

__version__: str

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]

def run_record(dir: str) -> dict[str, Any]: ...
def language_model_kind(path: str) -> str | None: ...

class Evaluator:
    @staticmethod
    def load(path: str, device: str = "cpu") -> Evaluator: ...
    @staticmethod
    def import_jax(
        params: str,
        mixer: str,
        n_outputs: int = 4,
        out: str | None = None,
        force: bool = False,
        device: str = "cpu",
    ) -> Evaluator: ...
    def config(self) -> dict[str, Any]: ...
    def hook_names(self) -> list[str]: ...
    def select_hooks(self, patterns: list[str]) -> list[str]: ...
    def logits(self, x: F32, batch: int = 256) -> F32: ...
    def patterns(self, x: F32, batch: int = 64) -> tuple[F32, F32]: ...
    def evaluate(self, x: F32, y: I64, batch: int = 256) -> dict[str, Any]: ...
    def latent_codes(
        self,
        x: F32,
        y: I64,
        rules: I64,
        perms: I64 | None = None,
        site: str = "paper",
        layers: list[int] | None = None,
        batch: int = 256,
    ) -> dict[str, Any]: ...
    def logic_evaluate(self, x: F32, y: F32, targets: F32, terms: U8, term_ids: I64, batch: int = 256) -> dict[str, Any]: ...
    def logic_latent_codes(
        self,
        x: F32,
        y: F32,
        targets: F32,
        terms: U8,
        term_ids: I64,
        site: str = "paper",
        layers: list[int] | None = None,
        batch: int = 256,
    ) -> dict[str, Any]: ...
    def run_with_cache(self, x: F32, names: list[str]) -> tuple[F32, list[tuple[str, F32]]]: ...
    def run_with_hooks(self, x: F32, hooks: list[tuple[str, Any]]) -> F32: ...

class LanguageModel:
    @staticmethod
    def load(path: str, device: str = "cpu") -> LanguageModel: ...
    def config(self) -> dict[str, Any]: ...
    def hook_names(self) -> list[str]: ...
    def select_hooks(self, patterns: list[str]) -> list[str]: ...
    def logits(self, tokens: I64) -> F32: ...
    def patterns(self, tokens: I64) -> tuple[F32, F32]: ...
    def run_with_cache(self, tokens: I64, names: list[str]) -> tuple[F32, list[tuple[str, F32]]]: ...
    def run_with_hooks(self, tokens: I64, hooks: list[tuple[str, Any]]) -> F32: ...

class _Tasks(ModuleType):
    def splits(self) -> list[tuple[str, int, int]]: ...
    def sample_sraven(self, split: str, set: str, n: int, seed: int, unpermuted: bool) -> dict[str, Any]: ...
    def validate_problems(self, x: F32, y: I64, rules: I64, perms: I64 | None = None) -> None: ...
    def save_sraven(self, path: str, x: F32, y: I64, rules: I64, perms: I64 | None = None) -> None: ...
    def load_sraven(self, path: str, features: int = 4, values: int = 8) -> dict[str, Any]: ...
    def sample_logic(
        self,
        split: str,
        set: str,
        n: int,
        seed: int,
        samples: int | None = None,
        frac_test: float | None = None,
        fixed_query: bool = False,
        fixed_context: bool = False,
    ) -> dict[str, Any]: ...
    def logic_split(self, split: str, samples: int | None = None, frac_test: float | None = None) -> tuple[int, int, int]: ...
    def validate_logic(self, x: F32, y: F32, targets: F32, terms: U8, term_ids: I64) -> None: ...
    def save_logic_file(self, path: str, x: F32, y: F32, targets: F32, terms: U8, term_ids: I64) -> None: ...
    def load_logic_file(self, path: str, variables: int = 4, terms: int = 2, samples: int = 32) -> dict[str, Any]: ...

class _Codes(ModuleType):
    def save_codes(self, path: str, codes: F32, label: I64, **arrays: Any) -> None: ...
    def load_codes(self, path: str) -> dict[str, Any]: ...
    def save_logic_codes(
        self, path: str, codes: F32, terms: I64, term_ids: I64, target: F32, prediction: F32, problem: I64
    ) -> None: ...
    def load_logic_codes(self, path: str) -> dict[str, Any]: ...

class _Analysis(ModuleType):
    def pca(self, x: F64, n_components: int) -> dict[str, F64]: ...
    def decode(
        self,
        x_train: F64,
        y_train: I64,
        x_test: F64,
        y_test: I64,
        c: float = 1.0,
        max_iter: int = 100,
        tol: float = 1e-4,
        shuffled_control: bool = True,
        seed: int = 0,
    ) -> dict[str, Any]: ...
    def kmeans(self, x: F64, k: int, n_init: int = 3, seed: int = 0, max_iter: int = 300, tol: float = 1e-4) -> dict[str, Any]: ...
    def silhouette(self, x: F64, labels: I64) -> float: ...
    def tsne(self, x: F64, perplexity: float = 30.0, theta: float = 0.5, max_iter: int = 1000, seed: int = 0) -> F64: ...
    def analyze(
        self,
        train: dict[str, Any],
        test: dict[str, Any],
        seed: int = 0,
        n_components: int = 2,
        shuffled_control: bool = True,
        kmeans_runs: int = 3,
        unsupervised_on: str = "test",
    ) -> dict[str, Any]: ...
    def term_decoding(
        self,
        train_codes: F32,
        train_terms: I64,
        train_term_ids: I64,
        test_codes: F32,
        test_terms: I64,
        test_term_ids: I64,
        seed: int = 0,
        c: float = 1.0,
        max_iter: int = 100,
    ) -> str: ...

class _Patching(ModuleType):
    def head_ablation_report(
        self, model: Evaluator, x: F32, y: I64, rules: I64, perms: I64 | None = None, ablation: str = "mean", batch: int = 128
    ) -> dict[str, Any]: ...
    def activation_patching_report(
        self, model: Evaluator, x: F32, y: I64, rules: I64, perms: I64 | None = None, slot: int = 3, batch: int = 128
    ) -> dict[str, Any]: ...
    def dla_report(
        self, model: Evaluator, x: F32, y: I64, rules: I64, perms: I64 | None = None, slots: list[int] | None = None, batch: int = 128
    ) -> dict[str, Any]: ...
    def transplant_rows(
        self,
        model: Evaluator,
        id_x: F32,
        id_y: I64,
        id_rules: I64,
        ood_x: F32,
        ood_y: I64,
        ood_rules: I64,
        slot: int = 3,
        batch: int = 128,
        seed: int = 0,
    ) -> tuple[list[dict[str, Any]], str]: ...

class _Circuits(ModuleType):
    def analyze(
        self,
        model: LanguageModel,
        seq_len: int | None = None,
        seed: int = 0,
        n_seqs: int = 8,
        bos: int | None = None,
        threshold: float = 0.4,
        baseline_samples: int = 1000,
        top: int = 20,
        fold_norm: bool = True,
        threads: int = 0,
    ) -> dict[str, Any]: ...
    def circuit(self, model: LanguageModel, layer: int, head: int, kind: str = "ov", fold_norm: bool = True) -> dict[str, Any]: ...
    def copying_scores(self, model: LanguageModel, fold_norm: bool = True) -> tuple[F64, F64]: ...

class _Train(ModuleType):
    def default_settings(self, task: str) -> str: ...
    def run_settings(self, dir: str) -> str: ...
    def check_settings(self, json: str) -> list[str]: ...
    def plan_group(
        self, out: str, base: str, seeds: list[int], splits: list[str], lrs: list[float], weight_decays: list[float], grid: bool
    ) -> list[tuple[str, str]]: ...
    def group_runs(self, out: str) -> list[tuple[str, str]] | None: ...
    def train_runs(
        self, runs: list[tuple[str, str]], device: str = "cpu", resume: bool = False, on_event: Any = None
    ) -> list[tuple[str | None, str | None, list[str]]]: ...

class _Report(ModuleType):
    def report(
        self,
        checkpoints: list[str],
        out: str,
        n: int = 2048,
        split: str = "paper-seed0",
        seed: int = 0,
        device: str = "cpu",
        batch: int = 256,
        causal_n: int = 128,
        aggregate: bool = False,
        on_progress: Any = None,
    ) -> tuple[str, int, float]: ...

class _Viz(ModuleType):
    def explorer(
        self, title: str, sets: list[dict[str, Any]], colorings: list[tuple[str, list[str]]],
        layer_names: list[str], key_names: list[str], projection: str = "pca",
        layer: int | None = None, seed: int = 0,
    ) -> dict[str, Any]: ...
    def patterns(
        self, title: str, values: F64, tokens: list[str], layer_names: list[str],
        head_names: list[str] | None = None, layer: int | None = None,
    ) -> dict[str, Any]: ...
    def heatmap(
        self, panels: list[dict[str, Any]], row_labels: list[str] | None = None,
        col_labels: list[str] | None = None, row_name: str = "", col_name: str = "",
        masked: str | None = None, start: int = 0,
    ) -> dict[str, Any]: ...
    def write(self, path: str, data: bytes) -> None: ...

class _LmAnalysis(ModuleType):
    def analyze_lm(
        self, codes: str, factor: str | None = None, shuffled_codes: str | None = None,
        min_accuracy: float | None = None, layers: list[int] | None = None, seed: int = 0,
        n_bootstrap: int = 1000, ci_level: float = 0.95, c: float = 1.0, max_iter: int = 100,
        n_components: int = 3, kmeans_runs: int = 3, unsupervised_on: str = "test",
    ) -> dict[str, Any]: ...

tasks: _Tasks
codes: _Codes
analysis: _Analysis
lm_analysis: _LmAnalysis
patching: _Patching
circuits: _Circuits
train: _Train
report: _Report
viz: _Viz
