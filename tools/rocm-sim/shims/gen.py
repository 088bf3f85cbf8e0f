"""A forwarding stand-in library: ``python gen.py OUT SONAME TARGET < symbols.txt``.

``symbols.txt`` has one ``symbol version-node`` pair a line. Writes ``OUT.c`` (each symbol an
assembly trampoline jumping through a table that a constructor fills with ``dlsym`` of the
same name in ``TARGET``: no signatures needed) and ``OUT.map`` (the version nodes, so the
plugin's versioned references bind)."""

import sys
from collections import defaultdict

out, soname, target = sys.argv[1:4]
pairs = [line.split() for line in sys.stdin if line.strip()]
symbols = [name for name, _ in pairs]
by_version = defaultdict(list)
for name, version in pairs:
    by_version[version].append(name)

names = ",".join(f'"{name}"' for name in symbols)
init = (f'__attribute__((constructor)) static void init(void) {{\n'
        f'  void *h = dlopen("{target}", RTLD_NOW | RTLD_GLOBAL);\n'
        f'  if (!h) {{ fprintf(stderr, "shim {soname}: %s\\n", dlerror()); return; }}\n'
        f'  for (int i = 0; i < {len(symbols)}; i++) rj_fwd_tab[i] = dlsym(h, names[i]);\n'
        f'}}\n')
with open(out + ".c", "w") as f:
    f.write("#include <dlfcn.h>\n#include <stdio.h>\n#include <stdlib.h>\n")
    f.write(f"void *rj_fwd_tab[{len(symbols)}];\n")
    f.write(f"static const char *names[] = {{{names}}};\n")
    f.write(init)
    f.write('__asm__(".text\\n"\n')
    for i, name in enumerate(symbols):
        f.write(f'".globl {name}\\n.type {name},@function\\n'
                f'{name}: jmp *rj_fwd_tab+{8 * i}(%rip)\\n"\n')
    f.write(");\n")
with open(out + ".map", "w") as f:
    for i, (version, names_of) in enumerate(by_version.items()):
        local = "local: *; " if i == 0 else ""
        f.write(f"{version} {{ global: {'; '.join(names_of)}; {local}}};\n")
