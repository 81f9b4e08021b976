; Definitions and references for Ruby.
(class name: (constant) @name) @definition.class
(class name: (scope_resolution name: (constant) @name)) @definition.class
(module name: (constant) @name) @definition.module
(module name: (scope_resolution name: (constant) @name)) @definition.module
(method name: (_) @name) @definition.method
(singleton_method name: (_) @name) @definition.method
(program (assignment left: (constant) @name) @definition.constant)
(call method: (identifier) @reference.call)
(superclass (constant) @reference.type)
(constant) @reference.type
