"""lazylab.configs.graph on a hand-made config (issue 36, item 4): the exact dot and Mermaid texts, worked out from
the declarations (width and variant given on the command line; size is width·depth by its one option; variant=fancy
selects an aggregate that sets depth to 4 and act to its gelu option; extra is never read)."""
from lazylab.configs import BaseConfigs, aggregate, apply_overrides, label_given, option
from lazylab.configs.graph import Graph, Node, graph, is_user_set, to_dot, to_mermaid


class Act:
    """Stands for a module an option builds (not plain data)."""

    def __init__(self, name: str):
        self.name = name


class Tiny(BaseConfigs):
    width: int = 8
    depth: int = 2
    size: int
    variant: str = 'plain'
    act: Act = 'relu'
    extra: int = 1


@option(Tiny.size)
def product(c):
    return c.width * c.depth


@option(Tiny.act, 'relu')
def _relu():
    return Act('relu')


@option(Tiny.act, 'gelu')
def _gelu():
    return Act('gelu')


aggregate(Tiny.variant, 'fancy', (Tiny.act, 'gelu'), (Tiny.depth, 4))


def _tiny() -> Tiny:
    conf = Tiny()
    apply_overrides(conf, {'width': '16', 'variant': 'fancy'})
    label_given(conf, ['width', 'variant'], 'user')
    assert conf.size == 64 and conf.act.name == 'gelu'
    return conf


def test_the_graph_of_a_tiny_config():
    g = graph(_tiny())
    assert g.nodes == [
        Node('width', '16', 'command line', True),
        Node('depth', '4', 'aggregate variant=fancy', False),
        Node('size', '64', 'option product', False),
        Node('variant', "'fancy'", 'command line', True),
        Node('act', 'Act', 'option gelu', False),
        Node('extra', '1', 'default, not computed', False),
    ]
    assert g.edges == [('variant', 'depth'), ('width', 'size'), ('depth', 'size'), ('variant', 'act')]


def test_the_dot_text_of_a_tiny_config():
    assert to_dot(graph(_tiny()), 'Tiny') == '''digraph "Tiny" {
  rankdir=LR;
  node [shape=box, style=rounded, fontname="Helvetica", fontsize=10];
  "width" [label="width = 16\\ncommand line", style="rounded,filled,bold", fillcolor="#fde68a"];
  "depth" [label="depth = 4\\naggregate variant=fancy"];
  "size" [label="size = 64\\noption product"];
  "variant" [label="variant = 'fancy'\\ncommand line", style="rounded,filled,bold", fillcolor="#fde68a"];
  "act" [label="act = Act\\noption gelu"];
  "extra" [label="extra = 1\\ndefault, not computed"];
  "variant" -> "depth";
  "width" -> "size";
  "depth" -> "size";
  "variant" -> "act";
}
'''


def test_the_mermaid_text_of_a_tiny_config():
    assert to_mermaid(graph(_tiny())) == '''flowchart LR
  n0["width = 16<br/>command line"]
  n1["depth = 4<br/>aggregate variant=fancy"]
  n2["size = 64<br/>option product"]
  n3["variant = 'fancy'<br/>command line"]
  n4["act = Act<br/>option gelu"]
  n5["extra = 1<br/>default, not computed"]
  n3 --> n1
  n0 --> n2
  n1 --> n2
  n3 --> n4
  classDef user fill:#fde68a,stroke:#b45309,stroke-width:2px
  class n0,n3 user
'''


def test_labels_are_escaped_for_dot_and_mermaid():
    g = Graph([Node('a', '\'say "hi" <b> #1 \\\'', 'default', False)], [])
    assert '"a" [label="a = \'say \\"hi\\" <b> #1 \\\\\'\\ndefault"];' in to_dot(g)
    assert 'n0["a = \'say #quot;hi#quot; #lt;b#gt; #35;1 \\\'<br/>default"]' in to_mermaid(g)


def test_user_set_is_the_command_line_a_config_file_or_the_environment():
    assert [is_user_set(label) for label in ('user', '--config a.yaml:3', 'env HOME', 'preset labml_nn', 'sweep',
                                             'override', None)] == [True, True, True, False, False, False, False]
