/* The book's own page script (loaded on every page by _config.yml: html_js_files, deferred,
   after the theme's scripts). Two things the theme (pydata-sphinx-theme 0.16.1) leaves undone:

   1. On a phone the page-contents and table-of-contents drawers are modal <dialog>s; choosing a
      section inside one scrolled the page behind it but left the drawer open over the text.
      A click on a link inside a drawer now closes the drawer (the theme's own "close" handler
      then puts the sidebar's content back).
   2. Landing on a page whose entry sits in the lower half of the window (chapter 13 at
      1280×800), the theme scrolls the sidebar so that the entry is a quarter of the way down,
      which hides the book's title and the search box above it. When the entry fits with the
      sidebar unscrolled, the sidebar is scrolled back to its top; otherwise only as far as
      needed to show the entry. A position the reader left the sidebar in is kept (the theme
      restores it from sessionStorage on the next page). */
(function () {
  "use strict";

  document.addEventListener("click", (event) => {
    const link = event.target.closest("dialog a[href]");
    const dialog = link && link.closest("dialog[open]");
    if (dialog && dialog.id !== "pst-search-dialog") dialog.close();
  });

  function keepTitleInView() {
    if (sessionStorage.getItem("sidebar-scroll-top") !== null) return;
    const sidebar = document.querySelector("div.bd-sidebar");
    const nav = document.querySelector(".bd-docs-nav");
    if (!sidebar || !nav) return;
    const active = nav.querySelectorAll(".active");
    if (!active.length) return;
    const entry = active[active.length - 1].getBoundingClientRect();
    const top = sidebar.getBoundingClientRect().top;
    const bottomUnscrolled = entry.bottom - top + sidebar.scrollTop;  // entry's bottom with scrollTop 0
    const margin = 16;
    sidebar.scrollTop = Math.max(0, bottomUnscrolled + margin - sidebar.clientHeight);
  }

  // The theme scrolls the sidebar once the page has loaded (its handler may be registered
  // after this one): run after every load handler.
  // Measured once the fonts are in: before that the entries wrap differently.
  const later = () => document.fonts.ready.then(() => setTimeout(keepTitleInView, 0));
  if (document.readyState === "complete") later();
  else window.addEventListener("load", later);
})();
