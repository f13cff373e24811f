#!/usr/bin/env python3
"""Rewrites CUDA triple-chevron launches for the host emulator (tests/cuda_emu/emu.hpp).

    NAME<<<CFG>>>(ARGS)   ->   ::emu::launch("NAME", NAME, ::emu::Config{CFG}, ARGS)
    extern __shared__ T x[];   ->   T* x = (the launch's dynamic shared memory)
    __shared__ T a[N][M], b[N];   ->   auto& a = ::emu::block_shared<T[N][M], ID>(); (same for b)
                                       (per-block storage, filled with garbage when a block starts)

NAME is the expression right before <<< (an identifier, possibly qualified, possibly followed by
balanced template arguments); CFG runs to the first >>> outside brackets (it may contain <<). Line
numbers are kept (a #line directive names the original file).

usage: transform.py SRC DST
"""
import re
import sys


def kernel_name_start(text, end):
    """Start index of the kernel expression that ends at text[end-1]."""
    i = end
    while i > 0 and text[i - 1].isspace():
        i -= 1
    if i > 0 and text[i - 1] == '>':  # template arguments: match brackets backwards
        depth = 0
        while i > 0:
            c = text[i - 1]
            if c in '>)]':
                depth += 1
            elif c in '<([':
                depth -= 1
            i -= 1
            if depth == 0:
                break
        while i > 0 and text[i - 1].isspace():
            i -= 1
    while i > 0 and (text[i - 1].isalnum() or text[i - 1] in '_:'):
        i -= 1
    return i


def config_end(text, start):
    """Index of the >>> closing the config that starts at text[start]."""
    depth = 0
    i = start
    while i < len(text):
        c = text[i]
        if c in '([{':
            depth += 1
        elif c in ')]}':
            depth -= 1
        elif depth == 0 and text.startswith('>>>', i):
            return i
        i += 1
    raise SystemExit('transform.py: unterminated <<< at offset %d' % start)


def transform(text):
    out = []
    pos = 0
    count = 0
    while True:
        k = text.find('<<<', pos)
        if k < 0:
            break
        s = kernel_name_start(text, k)
        name = text[s:k].strip()
        if not name or not re.match(r'[A-Za-z_:]', name):
            raise SystemExit('transform.py: no kernel name before <<< at offset %d' % k)
        e = config_end(text, k + 3)
        cfg = text[k + 3:e]
        j = e + 3
        while j < len(text) and text[j].isspace():
            j += 1
        if j >= len(text) or text[j] != '(':
            raise SystemExit('transform.py: no ( after >>> at offset %d' % e)
        j += 1
        rest = j
        while rest < len(text) and text[rest].isspace():
            rest += 1
        sep = '' if text[rest] == ')' else ', '
        out.append(text[pos:s])
        out.append('::emu::launch("%s", %s, ::emu::Config{%s}%s' % (name.replace('"', ''), name, cfg, sep))
        pos = j
        count += 1
    out.append(text[pos:])
    return dynamic_shared(''.join(out)), count


# extern __shared__ [__align__(N)] TYPE NAME[];  ->  TYPE* NAME = reinterpret_cast<TYPE*>(::emu::dynamic_smem());
EXTERN_SHARED = re.compile(r'extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([A-Za-z_][\w:\s]*?)\s+(\w+)\s*\[\s*\]\s*;')


def dynamic_shared(text):
    text = EXTERN_SHARED.sub(lambda m: '%s* %s = reinterpret_cast<%s*>(::emu::dynamic_smem());' % (m.group(1), m.group(2), m.group(1)),
                             text)
    return STATIC_SHARED.sub(static_shared, text)


# __shared__ [__align__(N)] TYPE NAME[..]..., NAME2[..]...;  (static shared arrays)
STATIC_SHARED = re.compile(r'__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([A-Za-z_][\w:]*)\s+([A-Za-z_]\w*\s*\[[^;]*);')
DECLARATOR = re.compile(r'\s*([A-Za-z_]\w*)\s*((?:\[[^\]]+\]\s*)+)$')


def static_shared(m):
    out = []
    for d in m.group(2).split(','):
        dm = DECLARATOR.match(d)
        if not dm:
            raise SystemExit('transform.py: cannot parse the __shared__ declarator %r' % d)
        out.append('auto& %s = ::emu::block_shared<%s%s, __COUNTER__>();' % (dm.group(1), m.group(1), dm.group(2).replace(' ', '')))
    return ' '.join(out)


def main():
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, encoding='utf-8') as f:
        text = f.read()
    res, _ = transform(text)
    res = '#line 1 "%s"\n%s' % (src, res)
    with open(dst, 'w', encoding='utf-8') as f:
        f.write(res)


if __name__ == '__main__':
    main()
