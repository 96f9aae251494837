"""Draws the integration's brand icon and the add-on's icon and logo: KV blocks in a pool."""

from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

SIZE = 256
OUT = Path(__file__).resolve().parents[1] / "custom_components/paged_llm/brand"
ADDON = Path(__file__).resolve().parents[1] / "addon"


def draw(size: int) -> Image.Image:
    """Return the icon at ``size`` pixels: a 4x4 grid of blocks, a few highlighted."""
    img = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    d = ImageDraw.Draw(img)
    pad, gap = size // 16, size // 32
    cell = (size - 2 * pad - 3 * gap) // 4
    used = {(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 3), (3, 0), (3, 2)}
    for row in range(4):
        for col in range(4):
            x = pad + col * (cell + gap)
            y = pad + row * (cell + gap)
            color = (3, 169, 244, 255) if (row, col) in used else (176, 190, 197, 255)
            d.rounded_rectangle((x, y, x + cell, y + cell), radius=cell // 6, fill=color)
    return img


def logo(width: int = 250, height: int = 100) -> Image.Image:
    """Return the add-on's logo: the icon, then the name (the add-on store's 250x100)."""
    img = Image.new("RGBA", (width, height), (0, 0, 0, 0))
    img.paste(draw(height), (0, 0))
    font = ImageFont.load_default(size=height // 4)
    ImageDraw.Draw(img).text(
        (height + 6, height // 2), "Paged LLM", fill=(3, 169, 244, 255), font=font, anchor="lm"
    )
    return img


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    draw(SIZE).save(OUT / "icon.png")
    draw(2 * SIZE).save(OUT / "icon@2x.png")
    # The add-on store shows a 128x128 icon and a 250x100 logo.
    draw(128).save(ADDON / "icon.png")
    logo().save(ADDON / "logo.png")
