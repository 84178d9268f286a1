"""Helpers shared by the kvsift.transformers tests (CPU and CUDA): greedy generation that keeps
the logits, and the largest logit gap between two generations."""


def generate(model, ids, cache, new=8):
    import torch

    with torch.no_grad():
        return model.generate(
            ids,
            past_key_values=cache,
            max_new_tokens=new,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )


def max_logit_gap(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a.logits, b.logits))
