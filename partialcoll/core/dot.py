"""Graphviz DOT export of a schedule's ops (Schedule.to_dot)."""

COLORS = {"send": "lightblue", "recv": "palegreen", "reduce": "orange",
          "copy": "orange", "scale": "orange", "callback": "orange",
          "nop": "white",
          "trigger": "gold", "fence": "plum", "delay": "lightpink",
          "start_at": "lightpink", "gate": "khaki"}


def _label(i, o, kind):
    label = f"{i}: {kind}"
    if kind in ("send", "recv"):
        label += f" {'to' if kind == 'send' else 'from'} {o['peer']} tag {o['tag']}"
        label += " (stamped)" if o["stamped"] else f"\\n{o['a']}"
        if o.get("timeout", -1) >= 0:
            label += f"\\ntimeout {o['timeout'] / 1e9:g} s"
        if o.get("order", -1) >= 0 or o.get("param") is not None:
            label += f"\\norder {o.get('param') or o['order']}"
    elif kind in ("reduce", "copy"):
        label += f" {o['op'].name if o['op'] else ''}\\n{o['a']} <- {o['b']}"
    elif kind == "callback":
        label += f" {o['name']}\\n{o['a']}, {o['b']}, {o['arg']}"
    elif kind == "scale":
        label += f"\\n{o['a']} / (delivered of {o['ref']} + {o['add']})"
    elif kind in ("delay", "start_at"):
        p = o.get("param")
        label += f" {p}" if p is not None else f" {o['value'] / 1e9:g} s"
    if o["need"]:
        label += f"\\n({o['need']} of {len(o['deps'])})"
    if o["prio_param"] is not None:
        label += f"\\nprio {o['prio_param']}"
    elif o["priority"]:
        label += f"\\nprio {o['priority']}"
    return label


def to_dot(ops, kind_names, mode_all, name="schedule"):
    lines = [f'digraph "{name}" {{', "  rankdir=TB;",
             "  node [shape=box, style=filled, fontname=Helvetica];"]
    for i, o in enumerate(ops):
        kind = kind_names[o["kind"]]
        style = ["filled"] + (["dashed"] if o["mode"] != mode_all else [])
        color = "lightgrey" if o["optional"] else COLORS.get(kind, "white")
        lines.append(f'  n{i} [label="{_label(i, o, kind)}", '
                     f'fillcolor="{color}", style="{",".join(style)}"];')
        lines += [f"  n{d} -> n{i};" for d in o["deps"]]
    lines.append("}")
    return "\n".join(lines) + "\n"
