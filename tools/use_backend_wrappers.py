#!/usr/bin/env python3
"""tools/use_backend_wrappers.py - rewrite direct calls through a backend's
table into the thin wrappers of kernels/backend.h, once (a mechanical pass).

    be->ops->copy_h2d(be, q, ...)     ->  sl_copy_h2d(be, q, ...)
    m->be->ops->queue_sync(m->be, q)  ->  sl_queue_sync(m->be, q)
    o->layernorm(m->be, ...)          ->  sl_layernorm(m->be, ...)
        (where `const sl_backend_ops *o = m->be->ops;` in that function)

The calls are those of kernels/backend_ops.def (read from it, so the pass
follows the list).  A call is rewritten only where its first argument is the
very backend whose table it reads, so the rewrite cannot change which
backend runs.  A `const sl_backend_ops *o = ...->ops;` left without a use in
its function is deleted (-Werror would refuse it unused); one still used
(o->dev_is_host, o->name) stays.  Table reads that are not calls
(be->ops->dev_is_host, be->ops->name, `if (!be->ops->h2o_compact)`) are
left alone.

Usage: tools/use_backend_wrappers.py [--dry-run] [PATH...]
PATHs are files or folders (their *.c and *.h); default: runtime offload.
Prints each file changed with its count, then every direct call left (with
the reason); exit status 0, or 1 when a call was left.
"""
import argparse
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))


def call_names():
    path = os.path.join(ROOT, 'kernels', 'backend_ops.def')
    with open(path, encoding='utf-8') as f:
        text = f.read()
    names = re.findall(r'^SL_BACKEND_(?:CALL\(\s*(?:int|void)\s*,|OP\()\s*(\w+)', text, re.M)
    if not names:
        sys.exit(f'{path}: no SL_BACKEND_CALL / SL_BACKEND_OP entries found')
    return names


# an lvalue naming a backend: be, m->be, v->b, g_be[s], p->b, T->host_be
EXPR = r'[A-Za-z_]\w*(?:(?:->|\.)[A-Za-z_]\w*|\[[^\[\]\n]*\])*?'
START = r'(?<![\w.>\]])'  # the expression starts here, not inside a longer one


def visual(line, upto):
    """The column at which line[upto] shows (tabs every 8)."""
    col = 0
    for ch in line[:upto]:
        col = (col // 8 + 1) * 8 if ch == '\t' else col + 1
    return col


def realign(text, at, shrink):
    """A call at text[at] got shrink characters shorter: move its
    continuation lines that were aligned to the right of it (under one of its
    parentheses) as far left, tabs then spaces, as the code's style is."""
    if shrink <= 0:
        return text
    line_start = text.rfind('\n', 0, at) + 1
    col = visual(text[line_start:], at - line_start)
    depth, i, in_str = 0, at, None
    out = [text[:at]]
    while i < len(text):
        ch = text[i]
        if in_str:
            if ch == '\\':
                out.append(text[i:i + 2])
                i += 2
                continue
            if ch == in_str:
                in_str = None
        elif ch in '"\'':
            in_str = ch
        elif ch == '(':
            depth += 1
        elif ch == ')':
            depth -= 1
            if depth == 0:
                out.append(text[i:])
                return ''.join(out)
        elif ch == '\n' and depth > 0:
            end = text.find('\n', i + 1)
            end = len(text) if end < 0 else end
            line = text[i + 1:end]
            body = line.lstrip(' \t')
            ind = visual(line, len(line) - len(body))
            if ind > col and body:
                ind -= shrink
                out.append('\n' + '\t' * (ind // 8) + ' ' * (ind % 8))
                i += 1 + len(line) - len(body)
                continue
        out.append(ch)
        i += 1
    return ''.join(out)


def sub_aligned(pattern, repl, text):
    """pattern.sub(repl, text), realigning each rewritten call's continuation
    lines (from the last call back, so that earlier offsets hold)."""
    parts, done, pos = [], [], 0
    for mt in pattern.finditer(text):
        new = repl(mt)
        parts.append(text[pos:mt.start()])
        done.append((sum(map(len, parts)), len(mt.group(0)) - len(new)))
        parts.append(new)
        pos = mt.end()
    parts.append(text[pos:])
    text = ''.join(parts)
    for at, shrink in reversed(done):
        text = realign(text, at, shrink)
    return text, len(done)


def rewrite(text, names):
    alt = '|'.join(sorted(names, key=len, reverse=True))

    # be->ops->fn(be, ...
    direct = re.compile(START + r'(?P<e>' + EXPR + r')->ops->(?P<fn>' + alt + r')\(\s*(?P=e)\s*,')
    text, n = sub_aligned(direct, lambda mt: f'sl_{mt.group("fn")}({mt.group("e")},', text)

    # const sl_backend_ops *o = E->ops;  ...  o->fn(E, ...
    decl = re.compile(r'^[ \t]*const sl_backend_ops \*(?P<v>\w+) = (?P<e>[^;\n]+)->ops;[ \t]*\n', re.M)
    out = []
    pos = 0
    for d in decl.finditer(text):
        if d.start() < pos:  # a second one in the same function: see the report
            continue
        out.append(text[pos:d.end()])
        # the declaration's scope: to the end of its function (a line "}")
        end = text.find('\n}', d.end())
        end = len(text) if end < 0 else end
        v, e = d.group('v'), re.escape(d.group('e').strip())
        via = re.compile(START + re.escape(v) + r'->(?P<fn>' + alt + r')\(\s*(?P<a>' + e + r')\s*,')
        body, k = sub_aligned(via, lambda mt: f'sl_{mt.group("fn")}({mt.group("a")},',
                              text[d.end():end])
        n += k
        if not re.search(START + re.escape(v) + r'\b', body):
            out[-1] = out[-1][:len(out[-1]) - len(d.group(0))]  # drop the unused declaration
        out.append(body)
        pos = end
    out.append(text[pos:])
    return ''.join(out), n


def leftovers(path, text, names):
    alt = '|'.join(names)
    left = []
    vars_ = set(re.findall(r'const sl_backend_ops \*(\w+) =', text))
    pats = [re.compile(r'->ops->(?:' + alt + r')\(')]
    pats += [re.compile(START + re.escape(v) + r'->(?:' + alt + r')\(') for v in vars_]
    for i, line in enumerate(text.split('\n'), 1):
        if any(p.search(line) for p in pats):
            left.append(f'{path}:{i}: left (its first argument is not the table\'s backend, '
                        f'or the call spans lines): {line.strip()}')
    return left


def files(paths):
    for p in paths:
        if os.path.isdir(p):
            for d, _, fs in sorted(os.walk(p)):
                for f in sorted(fs):
                    if f.endswith(('.c', '.h')):
                        yield os.path.join(d, f)
        elif os.path.isfile(p):
            yield p
        else:
            sys.exit(f'{p}: no such file or folder')


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--dry-run', action='store_true', help='report only; write nothing')
    ap.add_argument('paths', nargs='*')
    a = ap.parse_args()
    names = call_names()
    paths = a.paths or [os.path.join(ROOT, 'runtime'), os.path.join(ROOT, 'offload')]
    left = []
    for path in files(paths):
        with open(path, encoding='utf-8') as f:
            old = f.read()
        new, n = rewrite(old, names)
        if new != old:
            print(f'{path}: {n} call(s) rewritten')
            if not a.dry_run:
                with open(path, 'w', encoding='utf-8') as f:
                    f.write(new)
        left += leftovers(path, new, names)
    for line in left:
        print(line)
    return 1 if left else 0


if __name__ == '__main__':
    sys.exit(main())
