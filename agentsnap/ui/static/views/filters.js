// The filter forms above the views' tables: submitting one puts its fields in the address.

import { query } from "../api.js";
import { el } from "../dom.js";

// A form whose submit goes to `#${path}` with its fields `names` (in that order) as the query.
export function filterForm(path, names, className, ...children) {
  const form = el(
    "form",
    {
      class: className,
      onsubmit: (event) => {
        event.preventDefault();
        const data = new FormData(form);
        location.hash = `#${path}${query(Object.fromEntries(names.map((name) => [name, data.get(name)])))}`;
      },
    },
    ...children,
  );
  return form;
}

// A select of `values` after an empty choice (shown as `anyText`), `chosen` selected.
export function choiceSelect(name, label, values, chosen, anyText) {
  return el(
    "select",
    { name, "aria-label": label },
    ["", ...values].map((v) => el("option", { value: v, text: v || anyText, selected: v === chosen })),
  );
}
