// Figures open at full size: every image in the page content that is not already a link becomes a
// link to its own file, so a click shows it at its real resolution.
document.addEventListener("DOMContentLoaded", () => {
  for (const img of document.querySelectorAll("main img")) {
    if (img.closest("a")) continue;
    const link = document.createElement("a");
    link.href = img.currentSrc || img.src;
    link.className = "lfs-enlarge";
    link.title = "Open the figure at full size";
    img.replaceWith(link);
    link.appendChild(img);
  }
});
