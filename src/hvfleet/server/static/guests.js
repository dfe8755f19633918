// hvfleet dashboard: reads a chosen domain XML file into the check form's text box.
"use strict";
(function () {
  const file = document.getElementById("c-file");
  const text = document.getElementById("c-domain");
  if (!file || !text) return;
  file.addEventListener("change", () => {
    const f = file.files && file.files[0];
    if (!f) return;
    const reader = new FileReader();
    reader.onload = () => { text.value = String(reader.result); };
    reader.readAsText(f);
  });
})();
