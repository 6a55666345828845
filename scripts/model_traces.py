#!/usr/bin/python3
"""Writes traces/<model>.json: the parameter tensors of ResNet-50, VGG-16 and
BERT-base in forward (definition) order, with their element counts, derived
from the architectures (He et al. 2016 / torchvision resnet50; Simonyan and
Zisserman 2015 / torchvision vgg16; Devlin et al. 2019 / bert-base-uncased).
Backward produces the gradients in the reverse order; `xagg bench hetero`
streams them that way. Run from the source tree: scripts/model_traces.py"""
import json
import pathlib


def conv(name, cin, cout, k, bias=False):
    out = [(name + ".weight", cout * cin * k * k)]
    return out + [(name + ".bias", cout)] if bias else out


def norm(name, width):
    return [(name + ".weight", width), (name + ".bias", width)]


def linear(name, cin, cout):
    return [(name + ".weight", cin * cout), (name + ".bias", cout)]


def resnet50():
    tensors = conv("conv1", 3, 64, 7) + norm("bn1", 64)
    cin = 64
    for stage, (blocks, width) in enumerate(zip([3, 4, 6, 3], [64, 128, 256, 512]), start=1):
        for block in range(blocks):
            p = f"layer{stage}.{block}"
            tensors += conv(p + ".conv1", cin, width, 1) + norm(p + ".bn1", width)
            tensors += conv(p + ".conv2", width, width, 3) + norm(p + ".bn2", width)
            tensors += conv(p + ".conv3", width, 4 * width, 1) + norm(p + ".bn3", 4 * width)
            if block == 0:
                tensors += conv(p + ".downsample.0", cin, 4 * width, 1) + norm(p + ".downsample.1", 4 * width)
            cin = 4 * width
    return tensors + linear("fc", 2048, 1000)


def vgg16():
    tensors, cin, index = [], 3, 0
    for width in [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]:
        if width != "M":
            tensors += conv(f"features.{index}", cin, width, 3, bias=True)
            cin = width
        index += 1 if width == "M" else 2  # conv + ReLU
    return tensors + linear("classifier.0", 512 * 7 * 7, 4096) + linear("classifier.3", 4096, 4096) + \
        linear("classifier.6", 4096, 1000)


def bert_base(hidden=768, layers=12, intermediate=3072, vocab=30522, positions=512):
    tensors = [("embeddings.word_embeddings.weight", vocab * hidden),
               ("embeddings.position_embeddings.weight", positions * hidden),
               ("embeddings.token_type_embeddings.weight", 2 * hidden)] + norm("embeddings.LayerNorm", hidden)
    for layer in range(layers):
        p = f"encoder.layer.{layer}"
        for part in ["query", "key", "value"]:
            tensors += linear(f"{p}.attention.self.{part}", hidden, hidden)
        tensors += linear(f"{p}.attention.output.dense", hidden, hidden) + norm(f"{p}.attention.output.LayerNorm", hidden)
        tensors += linear(f"{p}.intermediate.dense", hidden, intermediate)
        tensors += linear(f"{p}.output.dense", intermediate, hidden) + norm(f"{p}.output.LayerNorm", hidden)
    return tensors + linear("pooler.dense", hidden, hidden)


if __name__ == "__main__":
    out = pathlib.Path(__file__).resolve().parent.parent / "traces"
    for model, tensors in [("resnet50", resnet50()), ("vgg16", vgg16()), ("bert-base", bert_base())]:
        total = sum(n for _, n in tensors)
        trace = {"model": model, "elements": total, "order": "forward",
                 "tensors": [{"name": name, "elements": n} for name, n in tensors]}
        (out / f"{model}.json").write_text(json.dumps(trace, indent=1) + "\n")
        print(f"{model}: {len(tensors)} tensors, {total} elements ({total * 4 / 1e6:.1f} MB fp32)")
