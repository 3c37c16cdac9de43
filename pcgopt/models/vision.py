"""Convolutional models: ResNeXt-50 (32x4d) and Inception-v3 (Unity), VGG13 (AutoDDL).

ResNeXt-50 and Inception-v3 follow torchvision's definitions (BatchNorm after every conv,
residual connections in ResNeXt, no auxiliary head in Inception). FlexFlow's Unity artifact used
simplified versions without BatchNorm or residuals; pcgopt keeps the real architectures.
``width`` scales every channel count (at least 1) for small test variants.
"""

from __future__ import annotations

from pcgopt.builder import PCGBuilder, Tensor
from pcgopt.graph import PCG
from pcgopt.models.layers import conv_bn, dense


def _global_pool_classifier(
    b: PCGBuilder, x: Tensor, num_classes: int, *, dropout: float | None = None
) -> Tensor:
    n, c, h, w = x.shape.sizes
    x = b.pool2d(x, kernel=(h, w), mode="avg", name="head/avgpool")
    x = b.reshape(x, shape=(n, c), name="head/flatten")
    if dropout is not None:
        x = b.dropout(x, rate=dropout, name="head/drop")
    return dense(b, x, num_classes, name="head/fc")


def resnext50(
    *,
    batch: int = 64,
    image: int = 224,
    groups: int = 32,
    width_per_group: int = 4,
    stage_blocks: tuple[int, ...] = (3, 4, 6, 3),
    stem: int = 64,
    num_classes: int = 1000,
) -> PCG:
    """ResNeXt-50 32x4d (Xie et al.): bottleneck blocks with grouped 3x3 convs, stages of
    3, 4, 6, 3 blocks, widths 128..1024, outputs 256..2048. Batch: Unity's per-GPU 64."""
    b = PCGBuilder()
    x = b.input((batch, 3, image, image), name="image")
    x = conv_bn(b, x, stem, 7, stride=2, padding=3, name="stem")
    x = b.pool2d(x, kernel=3, stride=2, padding=1, mode="max", name="stem/pool")
    for s, blocks in enumerate(stage_blocks):
        width = groups * width_per_group * 2**s
        out_ch = 2 * width
        for k in range(blocks):
            stride = 2 if (k == 0 and s > 0) else 1
            name = f"stage{s}/block{k}"
            y = conv_bn(b, x, width, 1, name=f"{name}/conv1")
            y = conv_bn(
                b, y, width, 3, stride=stride, padding=1, groups=groups, name=f"{name}/conv2"
            )
            y = conv_bn(b, y, out_ch, 1, relu=False, name=f"{name}/conv3")
            if k == 0:
                x = conv_bn(b, x, out_ch, 1, stride=stride, relu=False, name=f"{name}/downsample")
            x = b.relu(b.add(x, y, name=f"{name}/residual"), name=f"{name}/relu")
    return b.build(_global_pool_classifier(b, x, num_classes))


def inception_v3(
    *, batch: int = 64, image: int = 299, width: float = 1.0, num_classes: int = 1000
) -> PCG:
    """Inception-v3 (Szegedy et al.), torchvision's layout: stem, InceptionA x3, B, C x4, D,
    E x2, global average pool, dropout, classifier; 299x299 images (at least 75).
    Batch: Unity's per-GPU 64."""
    b = PCGBuilder()

    def ch(n: int) -> int:
        return max(1, round(n * width))

    def cbr(x, out, kernel, name, stride=1, padding=0):
        return conv_bn(b, x, ch(out), kernel, stride=stride, padding=padding, name=name)

    def avg_branch(x, out, name):
        p = b.pool2d(x, kernel=3, stride=1, padding=1, mode="avg", name=f"{name}/pool")
        return cbr(p, out, 1, f"{name}/conv")

    def block_a(x, pool_features, n):
        b1 = cbr(x, 64, 1, f"{n}/b1x1")
        b5 = cbr(cbr(x, 48, 1, f"{n}/b5x5_1"), 64, 5, f"{n}/b5x5_2", padding=2)
        b3 = cbr(
            cbr(cbr(x, 64, 1, f"{n}/b3x3dbl_1"), 96, 3, f"{n}/b3x3dbl_2", padding=1),
            96,
            3,
            f"{n}/b3x3dbl_3",
            padding=1,
        )
        return b.concat(
            b1, b5, b3, avg_branch(x, pool_features, f"{n}/bpool"), axis=1, name=f"{n}/concat"
        )

    def block_b(x, n):
        b3 = cbr(x, 384, 3, f"{n}/b3x3", stride=2)
        bd = cbr(
            cbr(cbr(x, 64, 1, f"{n}/b3x3dbl_1"), 96, 3, f"{n}/b3x3dbl_2", padding=1),
            96,
            3,
            f"{n}/b3x3dbl_3",
            stride=2,
        )
        bp = b.pool2d(x, kernel=3, stride=2, mode="max", name=f"{n}/bpool")
        return b.concat(b3, bd, bp, axis=1, name=f"{n}/concat")

    def block_c(x, c7, n):
        b1 = cbr(x, 192, 1, f"{n}/b1x1")
        b7 = cbr(x, c7, 1, f"{n}/b7x7_1")
        b7 = cbr(b7, c7, (1, 7), f"{n}/b7x7_2", padding=(0, 3))
        b7 = cbr(b7, 192, (7, 1), f"{n}/b7x7_3", padding=(3, 0))
        bd = cbr(x, c7, 1, f"{n}/b7x7dbl_1")
        for i, (k, p, out) in enumerate(
            [
                ((7, 1), (3, 0), c7),
                ((1, 7), (0, 3), c7),
                ((7, 1), (3, 0), c7),
                ((1, 7), (0, 3), 192),
            ],
            2,
        ):
            bd = cbr(bd, out, k, f"{n}/b7x7dbl_{i}", padding=p)
        return b.concat(b1, b7, bd, avg_branch(x, 192, f"{n}/bpool"), axis=1, name=f"{n}/concat")

    def block_d(x, n):
        b3 = cbr(cbr(x, 192, 1, f"{n}/b3x3_1"), 320, 3, f"{n}/b3x3_2", stride=2)
        b7 = cbr(x, 192, 1, f"{n}/b7x7x3_1")
        b7 = cbr(b7, 192, (1, 7), f"{n}/b7x7x3_2", padding=(0, 3))
        b7 = cbr(b7, 192, (7, 1), f"{n}/b7x7x3_3", padding=(3, 0))
        b7 = cbr(b7, 192, 3, f"{n}/b7x7x3_4", stride=2)
        bp = b.pool2d(x, kernel=3, stride=2, mode="max", name=f"{n}/bpool")
        return b.concat(b3, b7, bp, axis=1, name=f"{n}/concat")

    def block_e(x, n):
        b1 = cbr(x, 320, 1, f"{n}/b1x1")
        b3 = cbr(x, 384, 1, f"{n}/b3x3_1")
        b3 = b.concat(
            cbr(b3, 384, (1, 3), f"{n}/b3x3_2a", padding=(0, 1)),
            cbr(b3, 384, (3, 1), f"{n}/b3x3_2b", padding=(1, 0)),
            axis=1,
            name=f"{n}/b3x3_cat",
        )
        bd = cbr(cbr(x, 448, 1, f"{n}/b3x3dbl_1"), 384, 3, f"{n}/b3x3dbl_2", padding=1)
        bd = b.concat(
            cbr(bd, 384, (1, 3), f"{n}/b3x3dbl_3a", padding=(0, 1)),
            cbr(bd, 384, (3, 1), f"{n}/b3x3dbl_3b", padding=(1, 0)),
            axis=1,
            name=f"{n}/b3x3dbl_cat",
        )
        return b.concat(b1, b3, bd, avg_branch(x, 192, f"{n}/bpool"), axis=1, name=f"{n}/concat")

    x = b.input((batch, 3, image, image), name="image")
    x = cbr(x, 32, 3, "conv1a", stride=2)
    x = cbr(x, 32, 3, "conv2a")
    x = cbr(x, 64, 3, "conv2b", padding=1)
    x = b.pool2d(x, kernel=3, stride=2, mode="max", name="pool1")
    x = cbr(x, 80, 1, "conv3b")
    x = cbr(x, 192, 3, "conv4a")
    x = b.pool2d(x, kernel=3, stride=2, mode="max", name="pool2")
    for n, pf in (("mixed5b", 32), ("mixed5c", 64), ("mixed5d", 64)):
        x = block_a(x, pf, n)
    x = block_b(x, "mixed6a")
    for n, c7 in (("mixed6b", 128), ("mixed6c", 160), ("mixed6d", 160), ("mixed6e", 192)):
        x = block_c(x, c7, n)
    x = block_d(x, "mixed7a")
    x = block_e(x, "mixed7b")
    x = block_e(x, "mixed7c")
    return b.build(_global_pool_classifier(b, x, num_classes, dropout=0.5))


VGG13_LAYOUT = (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


def vgg13(
    *,
    batch: int = 128,
    image: int = 224,
    width: float = 1.0,
    hidden: int = 4096,
    num_classes: int = 1000,
) -> PCG:
    """VGG13 (Simonyan and Zisserman) as in AutoDDL section 5: ten 3x3 convs with ReLU and five
    max-pools, then dense 25088-4096-4096-1000 with ReLU and dropout. Batch: AutoDDL's VGG runs
    use 8 per node; the default is its 16-node run, 128."""
    b = PCGBuilder()
    x = b.input((batch, 3, image, image), name="image")
    k = 0
    for item in VGG13_LAYOUT:
        if item == "M":
            x = b.pool2d(x, kernel=2, mode="max", name=f"pool{k}")
            continue
        out = max(1, round(item * width))
        with b.scope(f"conv{k}"):
            w = b.weight((out, x.shape.sizes[1], 3, 3), name="w")
            bias = b.weight((out,), name="b")
            x = b.conv2d(x, w, bias, padding=1, activation="relu", name="conv")
        k += 1
    n, c, h, w_ = x.shape.sizes
    x = b.reshape(x, shape=(n, c * h * w_), name="flatten")
    x = dense(b, x, hidden, name="fc0", activation="relu")
    x = b.dropout(x, rate=0.5, name="drop0")
    x = dense(b, x, hidden, name="fc1", activation="relu")
    x = b.dropout(x, rate=0.5, name="drop1")
    return b.build(dense(b, x, num_classes, name="fc2"))
