"""Dict-shaped batches (laplace-torch's ``dict_key_x`` / ``dict_key_y``, for Hugging Face style
models whose forward takes a mapping): fit, predict and tune give what the same network gives on
(X, y) tensor batches, for every structure and subset; integer entries (token ids, masks) reach the
model unchanged; and the errors a user can meet."""

from collections import UserDict

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import laplace_from_scratch as lfs
from laplace_from_scratch.structures import STRUCTURES

D = torch.float64
TOL = 1e-12


class TakesDict(nn.Module):
    """An MLP on the entry ``"features"`` of the mapping it is called with."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).to(D)
        with torch.no_grad():
            for p in self.net.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=D))

    def forward(self, batch):
        return self.net(batch["features"])


def collate(rows):
    """What a Hugging Face collator returns: a mapping of stacked entries."""
    return UserDict({k: torch.stack([r[k] for r in rows]) for k in rows[0]})


def data(n=20):
    g = torch.Generator().manual_seed(1)
    X = torch.randn(n, 4, generator=g, dtype=D)
    y = torch.randint(0, 3, (n,), generator=g)
    rows = [{"features": X[i], "target": y[i]} for i in range(n)]
    return X, y, DataLoader(rows, batch_size=8, collate_fn=collate)


OPTIONS = {"lowrank": dict(rank=10), "matfree": dict(cg_tol=1e-12, preconditioner="none")}


@pytest.mark.parametrize("subset", ["all", "last_layer"])
@pytest.mark.parametrize("structure", list(STRUCTURES))
def test_dict_batches_give_what_tensor_batches_give(structure, subset):
    X, y, loader = data()
    model = TakesDict().eval()
    kw = dict(prior_precision=0.8, **OPTIONS.get(structure, {}))
    keys = dict(dict_key_x="features", dict_key_y="target")
    la = lfs.Laplace(model, "classification", subset, structure, **keys, **kw)
    la.fit(loader)
    ref = lfs.Laplace(model.net, "classification", subset, structure, **kw)
    ref.fit(DataLoader(TensorDataset(X, y), batch_size=8))
    batch = next(iter(loader))
    diffs = {
        "probit": (la(batch) - ref(X[:8])).abs().max(),
        "f_var": (la.glm_predictive(batch)[1] - ref.glm_predictive(X[:8])[1]).abs().max(),
        "evidence": (la.log_marginal_likelihood() - ref.log_marginal_likelihood()).abs(),
    }
    for what, d in diffs.items():
        print(f"{structure} {subset} {what}: max |Δ| = {d:.1e} (tol {TOL:.0e})")
        assert d <= TOL * 10 if structure == "matfree" else d <= TOL, what
    g = torch.Generator().manual_seed(2)
    assert la(batch, pred_type="nn", link_approx="mc", n_samples=3, generator=g).shape == (8, 3)
    la.optimize_prior_precision(method="gridsearch", val_loader=loader, grid_size=3)
    assert la.prior_precision.numel() == 1


class TokenModel(nn.Module):
    """input_ids (N, L) and attention_mask (N, L), Hugging Face's names: embed, mean over the
    unmasked tokens, classify."""

    def __init__(self, vocab=50):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab, 5).to(D)
        self.head = nn.Linear(5, 2).to(D)

    def forward(self, batch):
        mask = batch["attention_mask"].unsqueeze(-1).to(D)
        pooled = (self.embed(batch["input_ids"]) * mask).sum(1) / mask.sum(1)
        return self.head(pooled)


def token_loader(vocab=50, n=12):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, vocab, (n, 7), generator=g)
    mask = (torch.rand(n, 7, generator=g) > 0.3).long()
    mask[:, 0] = 1
    labels = torch.randint(0, 2, (n,), generator=g)
    rows = [{"input_ids": ids[i], "attention_mask": mask[i], "labels": labels[i]} for i in range(n)]
    return DataLoader(rows, batch_size=4, collate_fn=collate)


def test_token_ids_reach_the_model_unchanged():
    """laplace-torch's default keys; the integer entries travel packed in the parameters' dtype and
    come back as the same integers: the predictive equals the model's logits' GLM predictive."""
    model = TokenModel().eval()
    loader = token_loader()
    la = lfs.Laplace(model, "classification", "last_layer", "full")
    la.fit(loader)
    batch = next(iter(loader))
    packed = la._inputs(batch)
    unpacked = la._dict_inputs.unpack(packed)
    for key in ("input_ids", "attention_mask", "labels"):
        assert unpacked[key].dtype == batch[key].dtype and torch.equal(unpacked[key], batch[key])
    f_mu, f_var = la.glm_predictive(batch)
    with torch.no_grad():
        assert torch.equal(f_mu, model(batch))
    assert f_var.shape == (4, 2, 2) and la(batch, link_approx="mc", n_samples=5).shape == (4, 2)
    la.optimize_prior_precision(n_steps=3)


def test_dict_errors():
    model = TokenModel().eval()
    with pytest.raises(KeyError, match="tokens"):  # as laplace-torch: the inputs' key is missing
        lfs.Laplace(model, "classification", dict_key_x="tokens").fit(token_loader())
    la = lfs.Laplace(model, "classification", "last_layer", "diag")
    la.fit(token_loader())
    batch = dict(next(iter(token_loader())))
    before = la(batch)
    with pytest.raises(KeyError, match="input_ids"):  # a failed refit leaves the Laplace as it was
        la.fit([{"labels": batch["labels"]}])
    assert torch.equal(la(batch), before)
    with pytest.raises(ValueError, match="the training batches had"):
        la({k: v for k, v in batch.items() if k != "attention_mask"})
    float32 = lfs.Laplace(TokenModel().float().eval(), "classification", "last_layer", "diag")
    big = dict(batch, input_ids=batch["input_ids"] + 2**24)
    with pytest.raises(ValueError, match="cannot hold exactly"):  # (refused before the model runs)
        float32.fit([big])
    plain = lfs.Laplace(model.head, "classification", "all", "diag")
    plain.fit(DataLoader(TensorDataset(torch.randn(4, 5, dtype=D), torch.tensor([0, 1, 0, 1])), batch_size=2))
    with pytest.raises(ValueError, match="dict inputs need a Laplace fitted on dict batches"):
        plain(batch)
